"""Garbage collection of a data dir's artifact store: what recorded runs need, and what can go.

`plan_gc(store, roots, ...)` computes, without changing anything, which stored artifacts no recorded run needs and
which checkpoints may drop their optimizer state; `apply_gc` does it through the store (`remove`,
`drop_optimizer_state`). The flow layer finds the roots (the MLflow records of the runs, `flows.gc`).

What a recorded run needs (kept):
- every artifact its lineage names (taskset, rollouts, scores, advantages / ac_samples / pairs, steps, eval, ...);
- for each checkpoint it names (any key variant): that checkpoint, every artifact stored under the same key or a
  key derived from it (`<key>-...`: its segments' `steps` and `metrics`, a round's metrics, replay shard, drift,
  ...), its round's reward model, and the same for
  every segment listed in its trainer state (`segment_keys`) with the rollouts, scores and learning signal of
  every update in those segments' `steps` manifests;
- always: the inputs (`taskset`, `model`, `dataset` kinds), anything a running run holds (its run lock's keys and
  everything written since it took the lock) and anything written in the last `grace_s` seconds (runs without a
  lock: preference flows, iterative rounds, the Python API).
Everything else (killed runs' partial work, `--fresh` timing runs, runs whose record was deleted, untracked runs)
is unneeded.
"""

import os
import time
from dataclasses import dataclass, field

from coopflow.artifacts import ArtifactStore
from coopflow.stages.agents.checkpoint import (CheckpointLayout, drop_optimizer_state, find_checkpoint, is_weights_only,
                                      policy_key_of, weights_only_key)
from coopflow.stages.planning.keys import rm_round_key

ALWAYS_KEPT = ("taskset", "model", "dataset")
"""Inputs, not outputs of a run: built or installed once and read by every run of them."""


@dataclass(frozen=True)
class Roots:
    """What the recorded runs name: artifacts (kind, key) and which checkpoints are a run's final one."""

    artifacts: frozenset[tuple[str, str]] = frozenset()
    finals: frozenset[str] = frozenset()  # policy keys of recorded runs' final checkpoints
    runs: int = 0  # how many recorded runs the roots come from


@dataclass
class GcPlan:
    """What gc would do: artifacts to delete and checkpoints to drop optimizer state from, with their bytes."""

    delete: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, key, bytes)
    drop_optimizer: list[tuple[str, int]] = field(default_factory=list)  # (checkpoint policy key, bytes freed)
    slimmable: list[tuple[str, int, bool]] = field(default_factory=list)  # every kept segment checkpoint with
    # optimizer state: (policy key, bytes of that state, a recorded run's final); drop_optimizer picks from these
    kept: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (count, bytes) of what stays
    protected: int = 0  # unneeded by any record but kept: held by a running run or written within the grace period

    @property
    def bytes(self) -> int:
        return sum(b for *_, b in self.delete) + sum(b for _, b in self.drop_optimizer)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (count, bytes) of the artifacts to delete."""
        out: dict[str, tuple[int, int]] = {}
        for kind, _, b in self.delete:
            n, total = out.get(kind, (0, 0))
            out[kind] = (n + 1, total + b)
        return out


def needed(store: ArtifactStore, roots: Roots, extra_checkpoints: list[str] = ()) -> set[tuple[str, str]]:
    """Every (kind, key) the roots need (see the module doc), present in the store or not."""
    by_key: dict[str, list[str]] = {}
    family: dict[str, list[str]] = {}  # policy key -> the keys stored with it (itself, '-weights', steps, metrics)
    for kind, key in store.artifacts():
        by_key.setdefault(key, []).append(kind)
        family.setdefault(key.split("-", 1)[0], []).append(key)
    keep: set[tuple[str, str]] = set()
    steps: list[str] = []
    todo = [policy_key_of(k) for kind, k in roots.artifacts if kind == "checkpoint"]
    todo += [policy_key_of(k) for k in roots.finals] + list(extra_checkpoints)
    seen: set[str] = set()
    for kind, key in roots.artifacts:
        keep.add((kind, key))
        if kind == "steps":
            steps.append(key)
    while todo:
        k = todo.pop()
        if k in seen:
            continue
        seen.add(k)
        for variant in {k, weights_only_key(k), *family.get(k, ())}:
            keep.update((kind, variant) for kind in by_key.get(variant, ()))
            if "steps" in by_key.get(variant, ()):
                steps.append(variant)
        keep.add(("reward_model", rm_round_key(k)))
        steps.append(k)
        ck = find_checkpoint(store, k)
        if ck is not None:
            todo += [s for s in CheckpointLayout(store.path(ck.kind, ck.key)).trainer_state().get("segment_keys", [])]
    for k in steps:
        ref = store.find("steps", k)
        if ref is None:
            continue
        keep.add(("steps", k))
        for r in store.read_rows(ref):
            keep.update({("rollouts", r["rollouts"]), ("scores", r["scores"]), (r["signal_kind"], r["signal"])})
    return keep


def written_at(store: ArtifactStore, kind: str, key: str) -> float:
    """When an artifact was committed (its record's mtime; the dir's when it has none)."""
    p = store.path(kind, key)
    try:
        return os.stat(p / "ref.json").st_mtime
    except OSError:
        try:
            return os.stat(p).st_mtime
        except OSError:
            return 0.0


def plan_gc(store: ArtifactStore, roots: Roots, keep_optimizer: str = "all", grace_s: float = 3600.0,
            now: float | None = None) -> GcPlan:
    """What to delete and what to slim (nothing is changed). `keep_optimizer`: all (keep every checkpoint's
    optimizer state) | last (only recorded runs' final checkpoints keep it) | none."""
    now = time.time() if now is None else now
    locks = store.held_locks()
    held_since = min((lk["since"] for lk in locks), default=now)
    held_keys = [k for lk in locks for k in lk["keys"]]
    keep = needed(store, roots)
    held = needed(store, Roots(), held_keys) if held_keys else set()
    plan = GcPlan()
    for kind, key in store.artifacts():
        size = store.size(kind, key)
        if kind in ALWAYS_KEPT or (kind, key) in keep:
            n, b = plan.kept.get(kind, (0, 0))
            plan.kept[kind] = (n + 1, b + size)
            if kind == "checkpoint" and not is_weights_only(key) and (kind, key) not in held \
                    and _segment_checkpoint(store, key):
                plan.slimmable.append((key, store.size(kind, key, "optimizer"), key in roots.finals))
            continue
        written = written_at(store, kind, key)
        if (kind, key) in held or written >= min(held_since, now - grace_s):
            plan.protected += 1
            continue
        plan.delete.append((kind, key, size))
    plan.drop_optimizer = [(key, b) for key, b, final in plan.slimmable
                           if keep_optimizer == "none" or (keep_optimizer == "last" and not final)]
    return plan


def _segment_checkpoint(store: ArtifactStore, key: str) -> bool:
    """A checkpoint the segment loop wrote (its trainer state lists segment keys): only those may go weights-only
    (an iterative round's checkpoint is looked up under its own key)."""
    return bool(CheckpointLayout(store.path("checkpoint", key)).trainer_state().get("segment_keys"))


def apply_gc(store: ArtifactStore, plan: GcPlan, started: float) -> tuple[int, int]:
    """Carry out a plan: returns (artifacts deleted or slimmed, bytes freed). An artifact written after `started`
    or now held by a run that took its lock since is skipped (the plan was made before it)."""
    locks = store.held_locks()
    late = [lk for lk in locks if lk["since"] >= started]
    held = needed(store, Roots(), [k for lk in late for k in lk["keys"]]) if late else set()
    done, freed = 0, 0
    for kind, key, size in plan.delete:
        if (kind, key) in held or written_at(store, kind, key) >= started:
            continue
        if store.remove(kind, key):
            done, freed = done + 1, freed + size
    for key, size in plan.drop_optimizer:
        if ("checkpoint", key) in held or store.find("checkpoint", key) is None:
            continue
        drop_optimizer_state(store, key)
        done, freed = done + 1, freed + size
    store.clean_temp()
    return done, freed
