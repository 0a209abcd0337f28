"""What every config module shares: the strict base model, the spellings the settings accept, the helpers that
check or resolve a value (paths, per-agent lists) and `_override`, the one way a config re-declares an inherited
field with another default."""

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

ALGORITHM_ADVANTAGE = {"magrpo": "mean", "mareinforce": "raw", "marloo": "rloo", "maremax": "max"}
"""Each MAGRPO-family algorithm is MAGRPO with a different default `advantage_mode`; nothing else differs."""

JOINT_MODE_ALIASES = {"aligned": "aligned", "align": "aligned", "cross": "cross", "crossed": "cross"}

COLLABORATION_ALIASES = {"decentralized": "decentralized", "decentralised": "decentralized",
                         "multi_agent": "decentralized", "multi-agent": "decentralized",
                         "centralized": "centralized", "centralised": "centralized", "single_agent": "centralized",
                         "single-agent": "centralized"}
"""collaboration_mode spellings the reference accepts, mapped to the two modes."""

GENERATION_ALIASES = {**COLLABORATION_ALIASES, "centralized_sequential": "centralized_sequential",
                      "centralised_sequential": "centralized_sequential", "sequential": "centralized_sequential"}
"""comparator_generation_mode spellings, mapped to decentralized | centralized | centralized_sequential."""


def per_agent_values(value: Any, n: int, what: str) -> list:
    """A per-agent setting for each of n agents: one value (or a 1-list) for all, or a list of exactly n."""
    if not isinstance(value, list):
        return [value] * n
    if len(value) == 1:
        return value * n
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} entries for {n} agents")
    return list(value)


def store_path(value: str, what: str = "data_dir") -> str:
    """A data dir given as a path or a `file://` URI, as a path. Other schemes are refused: the store commits by an
    atomic rename, which object storage (s3://, gs://, ...) does not have (see README, "Scale out")."""
    if "://" not in value:
        return value
    from urllib.parse import unquote, urlparse

    u = urlparse(value)
    if u.scheme != "file":
        raise ValueError(f"{what} {value!r}: a {u.scheme}:// data dir is not supported (the local store commits by an "
                         "atomic rename, which object storage lacks): keep data_dir a local path (or a shared POSIX "
                         f"mount) and set remote_store: {value} to mirror the artifacts to object storage")
    if u.netloc not in ("", "localhost"):
        raise ValueError(f"{what} {value!r}: a file:// URI names this machine's files (file:///path); mount "
                         f"{u.netloc}'s share locally instead")
    return unquote(u.path)


def data_dir_path(value: str | None) -> Path:
    """The data dir: `value` > $COOPFLOW_HOME > ./.coopflow (paths or file:// URIs), absolute."""
    raw = value or os.environ.get("COOPFLOW_HOME") or ".coopflow"
    return Path(store_path(raw, "data_dir" if value else "COOPFLOW_HOME")).expanduser().resolve()


def is_local_model_path(src: str) -> bool:
    """A model source that can only be a local directory ('./x', '/x', '~/x', 'a/b/c'; not 'tiny' or 'org/name')."""
    return src.startswith((".", "/", "~")) or src.count("/") > 1


def missing_model_dir_message(what: str, src: str) -> str:
    """The error for a local model source whose directory does not exist (`what`: the config field)."""
    return (f"{what}: model directory {src!r} does not exist (a source is 'tiny', an existing local directory or a "
            "Hugging Face model id like 'org/name')")


def _alias(v: Any, aliases: dict[str, str], what: str, choices: str) -> str:
    """A setting's canonical name from its (case-insensitive) spellings; a ValueError naming the choices."""
    key = str(v).lower()
    if key not in aliases:
        raise ValueError(f"{what} must be {choices}; got {v!r}")
    return aliases[key]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending field."""


_LIMITS = ("ge", "gt", "le", "lt")


def field_limits(f: FieldInfo) -> dict[str, Any]:
    """A field's numeric limits, e.g. {'ge': 1}."""
    return {k: getattr(m, k) for m in f.metadata for k in _LIMITS if hasattr(m, k)}


def _override(base: type[BaseModel], name: str, default: Any, description: str | None = None, **limits: Any) -> Any:
    """`base`'s field `name` with another default; its limits and description are kept unless given."""
    f = base.model_fields[name]
    return Field(default, description=description or f.description, **(field_limits(f) | limits))


def deep_merge(a: dict, b: dict) -> dict:
    """`a` with `b` merged over it: nested mappings key by key, anything else (lists included) replaced by b's."""
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
