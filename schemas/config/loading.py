"""Reading a run config: a YAML/JSON file, `--set a.b=c` overrides with the config's dotted paths, and validation
into the algorithm's run config class, every problem reported as one ConfigError line naming the field."""

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from coopflow.schemas.config.common import ConfigError, deep_merge
from coopflow.schemas.config.run import RUN_CONFIGS, RunConfig


def _parse_value(text: str) -> Any:
    """Parse an override value: YAML scalars/lists/maps ('1e-3', 'true', 'null', '[a, b]')."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str] | dict[str, Any] | None) -> dict:
    """Apply `a.b.c=value` overrides (or a {dotted: value} dict) to a nested dict, in place."""
    items = overrides.items() if isinstance(overrides, dict) else []
    if isinstance(overrides, list):
        pairs = []
        for ov in overrides:
            if "=" not in ov:
                raise ConfigError(f"override {ov!r} must look like key.path=value")
            k, v = ov.split("=", 1)
            pairs.append((k.strip(), _parse_value(v)))
        items = pairs
    for key, value in items:
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
            node = node[p]
        node[parts[-1]] = value
    return data


def format_validation_error(err: ValidationError) -> str:
    """One readable line per problem, each naming the dotted field path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        show = e["type"] != "missing" and not isinstance(got, dict) and repr(got) not in msg
        lines.append(f"{loc or '<config>'}: {msg}" + (f" (got {got!r})" if show else ""))
    return "invalid config: " + "; ".join(lines)


def validate_config(data: dict, algorithm: str | None = None) -> RunConfig:
    """Validate a config dict; raises ConfigError naming the field."""
    from coopflow.schemas.config.environment import expand_environment

    data = expand_environment(dict(data))  # `env:` first: the config's own values win over the environment's
    if algorithm is not None:
        if data.get("algorithm") not in (None, algorithm):
            raise ConfigError(f"algorithm: config says {data['algorithm']!r} but the flow is train-{algorithm}")
        data["algorithm"] = algorithm
    cls = RUN_CONFIGS.get(str(data.get("algorithm")), RunConfig)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML or JSON config file into a dict."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"cannot parse config file {p}:{err.lineno}:{err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:  # one line: file:line:column: what the parser expected
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(f"cannot parse config file {p}{where}: {what}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None,
                algorithm: str | None = None, base: dict | None = None) -> RunConfig:
    """File (optional) + base dict (optional) + overrides -> validated RunConfig."""
    data: dict = {}
    if path is not None:
        data = read_config_file(path)
    if base:
        data = deep_merge(data, base)
    data = apply_overrides(data, overrides)
    return validate_config(data, algorithm)
