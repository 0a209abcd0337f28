"""Environments: a task family as one object, named by a config's `env:`.

An environment bundles everything a run of one task needs besides the models and the trainer: the taskset, each
agent's formatter (its role prompt), the shared reward, the multi-turn transition, the evaluation hooks and any
defaults of its own (for example how many agents it has). A config names one

    env: humaneval                        # a shipped environment, by name (`coopflow.envs.ENVIRONMENTS`)
    env: coopflow.envs.coding:HumanEval   # the same, by import path
    env: mypkg.tasks:MyTask               # your own: an Environment, a subclass of it, or a module's ENVIRONMENT

and may still set any part itself: the config's own values win key by key (`taskset.num_items` next to the
environment's taskset name), and a list such as `formatters` is replaced whole. The environment is expanded into
the config before validation, so a run — its keys included — sees only the resulting parts: two configs that
resolve to the same parts compute the same artifacts, whatever they call the environment, and editing an
environment's parts (or the code they name) changes the keys of the runs that use it.
"""

import copy
import importlib
from typing import Any

from coopflow.schemas.config.common import ConfigError, deep_merge

ENVIRONMENTS: dict[str, str] = {
    "story": "coopflow.envs.writing:Story",
    "tldr": "coopflow.envs.writing:TLDR",
    "arxiv": "coopflow.envs.arxiv:Arxiv",
    "humaneval": "coopflow.envs.coding:HumanEval",
    "completion": "coopflow.envs.completion:Completion",
    "gsm8k": "coopflow.envs.math_gsm8k:GSM8K",
    "bfcl": "coopflow.envs.tooluse:BFCL",
    "travel": "coopflow.envs.travel:Travel",
}
"""The shipped environments by name (`env: <name>`; each also importable by its path, `coopflow.envs.ENVIRONMENTS`)."""

PARTS = ("taskset", "reward", "formatters", "transition", "eval_logger", "eval_aggregator")
"""The config sections an environment fills (each as the config writes it)."""


class Environment:
    """A task family: the config sections it fills, as a config would write them.

    Build one with keywords (`Environment(name=..., taskset={...}, reward=...)`) or as a subclass whose class
    attributes are the parts. Parts:

    - `taskset`: the taskset section, or just its name (`"humaneval"`).
    - `reward`: the reward section, or just its name (an import path `pkg.mod:fn` or a built-in reward).
    - `formatters`: one formatter section per agent (a list), or one for all.
    - `transition`: the multi-turn transition section, or its name (used when `trainer.num_turns > 1`).
    - `eval_logger`, `eval_aggregator`: import paths of the evaluation hooks.
    - `defaults`: any other config values, nested (`{"agents": {"num_agents": 2}}`); the config's own win.
    """

    name: str = ""
    description: str = ""
    taskset: dict | str | None = None
    reward: dict | str | None = None
    formatters: list | dict | None = None
    transition: dict | str | None = None
    eval_logger: str | None = None
    eval_aggregator: str | None = None
    defaults: dict | None = None

    def __init__(self, **parts: Any) -> None:
        allowed = {"name", "description", "defaults", *PARTS}
        unknown = sorted(set(parts) - allowed)
        if unknown:
            raise TypeError(f"Environment: unknown part(s) {unknown}; parts are {sorted(allowed)}")
        for k, v in parts.items():
            setattr(self, k, v)

    def config(self) -> dict:
        """The config fragment this environment stands for (a fresh copy)."""
        out: dict = copy.deepcopy(self.defaults or {})
        for part in PARTS:
            value = getattr(self, part)
            if value is None:
                continue
            if part in ("taskset", "reward", "transition") and isinstance(value, str):
                value = {"name": value}
            out[part] = copy.deepcopy(value)
        return out

    def __repr__(self) -> str:
        return f"Environment({self.name or type(self).__name__!r})"


def resolve_environment(ref: str) -> Environment:
    """The environment `ref` names: a shipped name, `module:attribute` or a module with an ENVIRONMENT. ConfigError
    (one line) when it cannot be found or is not an environment."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"env: give an environment name ({', '.join(ENVIRONMENTS)}) or an import path "
                          f"(pkg.module:Name), got {ref!r}")
    path = ENVIRONMENTS.get(ref, ref)
    module_name, _, attr = path.partition(":")
    if not attr and "." not in module_name:
        raise ConfigError(f"env: no environment named {ref!r}; shipped: {', '.join(ENVIRONMENTS)} (or an import "
                          "path, pkg.module:Name)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"env: cannot import {module_name!r} ({err})") from None
    obj = getattr(module, attr or "ENVIRONMENT", None)
    if obj is None:
        raise ConfigError(f"env: {module_name} has no {attr or 'ENVIRONMENT'}")
    if isinstance(obj, type) and issubclass(obj, Environment):
        obj = obj()
    if not isinstance(obj, Environment):
        raise ConfigError(f"env: {path} is a {type(obj).__name__}, not a coopflow.envs.Environment")
    return obj


def expand_environment(data: dict) -> dict:
    """`data` with its `env:` expanded under it (the config's own values win; lists are replaced whole)."""
    ref = data.get("env")
    if ref is None:
        return data
    return deep_merge(resolve_environment(ref).config(), data)
