"""The settings a stage sees: a frozen view of the config holding exactly what the stage's key holds.

A stage computing an artifact of kind K is handed `RunSettings.view(K)`: the config fields that K declares as
inputs (`inputs.INPUTS[K]`) and those of the kinds whose keys are upstream of K's key (`chain`): the rollouts of
an update hold the policy key they were sampled from, which holds the start inputs, so the rollout stage may read
the start settings too. Reading any other field raises `UndeclaredSetting` on the spot, so a stage cannot depend
on a setting its key does not hold: the key-completeness of the cache holds by construction, for every algorithm
(online, preference, iterative), not only where a test looked.

Execution settings (threads, devices, executors, limits: `inputs.NO_EFFECT`, each with the reason it changes no
stored content) are a separate view, `RunSettings.execution`, never hashed.

What a key hashes is `RunSettings.declared[K]`: the same declared values (with the code digest of the fields that
name code), computed once per run. Properties and methods of the config models read through a view only when the
fields they are computed from are readable (`DERIVED`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from pydantic import BaseModel

from coopflow.stages.planning.inputs import INPUTS, NO_EFFECT, covers, declared_values, has_field, left_out_of

DERIVED: dict[str, tuple[str, ...]] = {
    "advantage_mode": ("trainer.advantage_mode", "algorithm"),
    "centralized": ("trainer.collaboration_mode",),
    "actor_sources": ("agents.agent_model", "agents.agents", "agents.num_agents", "trainer.collaboration_mode"),
    "critic_sources": ("critic.critic_model", "critic.critics", "agents.agent_model", "agents.agents",
                       "agents.num_agents"),
    "formatter_for": ("formatters",),
    "agents.n": ("agents.agent_model", "agents.agents", "agents.num_agents"),
    "agents.sources": ("agents.agent_model", "agents.agents", "agents.num_agents"),
    "trainer.batch_size": ("trainer.train_batch_size", "trainer.rollout_buffer_size"),
    "trainer.critic_lr": ("trainer.critic_learning_rate", "trainer.agent_learning_rate"),
    "trainer.uses_critics": ("trainer.rl_algorithm",),
    "ray.per_agent": ("ray.num_cpus_per_agent", "ray.num_gpus_per_agent"),
}
"""Properties and methods of the config models -> the fields they are computed from. A property a trainer
defines as a constant (IAC's `joint_mode`) reads as the field of that name would."""


class UndeclaredSetting(AttributeError):
    """A stage read a config field its artifact's key does not hold."""


class NoSuchSetting(AttributeError):
    """A stage asked a settings view for a name its config section does not have."""


def chain(kind: str, actor_critic: bool, multi_turn: bool, iterative: bool = False) -> tuple[str, ...]:
    """The kinds whose declared inputs the stage computing `kind` may read: its own and those of every key upstream
    of its key (`stages.planning.keys`). Multi-turn rollouts hold the episode's inputs; single-turn ones do not.
    Every artifact of an iterative round is keyed by the round's key (`keys.round_keys`, `keys.rm_round_key`)."""
    if iterative and kind in ("candidates", "pairs", "preference_scores", "dpo", "reward_model", "round"):
        return ("start", "round")
    if iterative and kind in ("dpo_metrics", "round_metrics"):
        return ("start", "round", "metrics")
    rollouts = ("start", "rollouts", *(("episode",) if multi_turn else ()))
    policy = (*rollouts, "ac_samples" if actor_critic else "advantages", "policy")
    pairs = ("start", "candidates", "scores", "pairs")
    return {
        "model": ("model",),
        "plan": ("plan",),
        "start": ("start",),
        "rollouts": rollouts,
        "scores": (*rollouts, "scores"),
        "advantages": (*rollouts, "advantages"),
        "ac_samples": (*rollouts, "ac_samples"),
        "policy": policy,
        "steps": policy,
        "metrics": (*policy, "metrics"),
        "eval": ("start", "eval"),
        "critic": (*policy, "critic"),
        "candidates": ("start", "candidates"),
        "pairs": pairs,
        "preference_scores": pairs[:-1],
        "dpo": (*pairs, "dpo"),
        "dpo_metrics": (*pairs, "dpo", "metrics"),
        "reward_model": (*pairs, "reward_model"),
        "round": ("start", "round"),
        "round_metrics": ("start", "round", "metrics"),
    }[kind]


class Settings:
    """A read-only view of config `root` restricted to the paths `allowed` covers and `denied` does not.

    `view.trainer.temperature` reads the field when a declared path covers it; a section with nothing denied
    under it reads as a copy of the section (so a stage cannot change the config through it); a section partly
    readable reads as a view of itself. Anything else raises `UndeclaredSetting`, naming the field and where to
    declare it.
    """

    __slots__ = ("_root", "_node", "_prefix", "_allowed", "_denied", "_what")

    def __init__(self, root: BaseModel, allowed: frozenset[str], denied: frozenset[str], what: str,
                 prefix: str = "", node: BaseModel | None = None):
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_node", root if node is None else node)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_denied", denied)
        object.__setattr__(self, "_what", what)

    def _readable(self, path: str) -> bool:
        return (any(covers(a, path) for a in self._allowed)
                and not any(covers(d, path) for d in self._denied))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise NoSuchSetting(name)
        path = self._prefix + name
        node = self._node
        if name in type(node).model_fields:
            value = getattr(node, name)
            if self._readable(path):
                if isinstance(value, BaseModel) and any(covers(path, d) for d in self._denied):
                    return Settings(self._root, self._allowed, self._denied, self._what, path + ".", value)
                return copy.deepcopy(value)
            if isinstance(value, BaseModel) and any(covers(path, a) for a in self._allowed):
                return Settings(self._root, self._allowed, self._denied, self._what, path + ".", value)
            raise UndeclaredSetting(self._refusal(path))
        if not hasattr(type(node), name):
            raise NoSuchSetting(f"{type(node).__name__} has no setting {path!r}")
        deps = DERIVED.get(path)
        if deps is None:  # a trainer's constant in place of a field (IAC's joint_mode), or an unlisted method
            if not self._readable(path) or callable(getattr(type(node), name, None)):
                raise UndeclaredSetting(self._refusal(path) + " (a property or method of the config: list the "
                                        "fields it reads in settings.DERIVED)")
            return getattr(node, name)
        missing = [d for d in deps if has_field(self._root, d) and not self._readable(d)]
        if missing:
            raise UndeclaredSetting(self._refusal(path) + f": it is computed from {', '.join(missing)}")
        return getattr(node, name)

    def reads(self, path: str) -> bool:
        """Whether this view lets its stage read config field `path` (a full dotted path from the config's root)."""
        return self._readable(path)

    def held(self, name: str, default: Any = None) -> Any:
        """Field `name` when this view holds it, else `default` (never the config's value): for a helper shared by
        stages of which only some read the field (policies load reference models only for a stage whose key
        holds `reference_kl_enabled`). Only 'not held' gives the default: an error inside a derived setting's code
        is raised, not mistaken for an absent setting."""
        try:
            return getattr(self, name)
        except (NoSuchSetting, UndeclaredSetting):
            return default

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are frozen: cannot set {self._prefix + name!r}")

    def _refusal(self, path: str) -> str:
        return (f"the {self._what} read setting {path!r}, which its key does not hold: declare it in "
                f"coopflow/stages/planning/inputs.py (INPUTS of the kind, or NO_EFFECT with the reason it changes "
                f"no stored content)")

    def __repr__(self) -> str:
        return f"Settings({self._what}, {self._prefix or '<root>'})"


@dataclass(frozen=True, eq=False)
class RunSettings:
    """A run's settings, built once from (a private copy of) its config: what each kind's key hashes (`declared`),
    the view each stage reads (`view(kind)`, or `settings.<kind>`) and the execution settings (`execution`)."""

    _config: BaseModel = field(repr=False)
    actor_critic: bool  # IAC / MAAC: the policy chain holds ac_samples instead of advantages
    multi_turn: bool  # rollouts hold the episode's inputs
    iterative: bool  # MADPO-iter / MARLHF-iter: every artifact of a round is keyed by the round's key
    declared: Mapping[str, Mapping[str, Any]]  # kind -> {path: value, 'code:<path>': digest}: what its key hashes
    _views: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, cfg: BaseModel) -> "RunSettings":
        """The settings of run config `cfg` (its code digests read now: build it inside `code_identity.planning`
        so a run's keys see one state of the code)."""
        from coopflow.stages.planning.plan import is_actor_critic

        cfg = cfg.model_copy(deep=True)
        declared = {kind: MappingProxyType(declared_values(cfg, kind)) for kind in INPUTS}
        multi = cfg.trainer.num_turns > 1 and cfg.transition is not None
        iterative = hasattr(cfg.trainer, "num_iterations") and cfg.algorithm.endswith("-iter")
        return cls(cfg, is_actor_critic(cfg), multi, iterative, MappingProxyType(declared))

    def view(self, kind: str) -> Settings:
        """The settings the stage computing `kind` reads (see `chain`)."""
        if kind not in self._views:
            kinds = chain(kind, self.actor_critic, self.multi_turn, self.iterative)
            allowed = frozenset(p for k in kinds for p in INPUTS[k] if not p.startswith("-"))
            # a field is readable when some kind of the chain holds it (a '-' entry leaves it out of its own kind
            # only); NO_EFFECT fields are never in a key: they are read through `execution`
            left_out = {p[1:] for k in kinds for p in INPUTS[k] if p.startswith("-")}
            # (a NO_EFFECT field that a kind of the chain names explicitly is that kind's input: reward_range shapes an
            # iterative round's reward-drift records, while elsewhere it only checks)
            explicit = {p for k in kinds for p in INPUTS[k]}
            denied = frozenset(p for p in NO_EFFECT if p not in explicit) | frozenset(p for p in left_out if not any(
                p not in left_out_of(k) and any(covers(a, p) for a in INPUTS[k] if not a.startswith("-"))
                for k in kinds))
            self._views[kind] = Settings(self._config, allowed, denied, f"{kind} stage")
        return self._views[kind]

    @property
    def execution(self) -> Settings:
        """Where and how fast the stages run, limits and tracking (`inputs.NO_EFFECT`): never in a key."""
        if "execution" not in self._views:
            self._views["execution"] = Settings(self._config, frozenset(NO_EFFECT), frozenset(), "execution settings")
        return self._views["execution"]

    def __getattr__(self, kind: str) -> Settings:
        if kind.startswith("_") or kind not in _VIEW_NAMES:
            raise AttributeError(kind)
        return self.view(kind)


_VIEW_NAMES = frozenset(("model", "plan", "start", "rollouts", "scores", "advantages", "ac_samples", "policy", "steps", "metrics",
                         "eval", "critic", "candidates", "pairs", "preference_scores", "dpo", "dpo_metrics",
                         "reward_model", "round", "round_metrics"))
