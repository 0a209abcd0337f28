"""The plan of a run: its updates and checkpointed segments, computed before anything runs.

- **updates**: one policy update per `rollout_buffer_size` node samples, as the fewest whole
  episode trees that hold them (single turn: `rollout_buffer_size` items; trees are never split
  across updates); items in file order, epoch after epoch, the last chunk of an epoch may be short;
- **segments**: runs of updates ending in a checkpoint (`checkpoint_every` updates, 0 = one per epoch).

`RunPlan` holds them with the start key, the checkpoint key every segment ends at (see
`stages.planning.keys`), the run's budget and its planning warnings; it is frozen.
"""

from dataclasses import dataclass

from coopflow.schemas.config import ALGORITHM_ADVANTAGE
from coopflow.stages.planning import budget

AC_ALGORITHMS = ("iac", "maac")


def is_actor_critic(cfg) -> bool:
    """IAC / MAAC (a critic's values shape the advantages) rather than a MAGRPO-family baseline."""
    return cfg.algorithm in AC_ALGORITHMS


def trains_in_segments(cfg) -> bool:
    """Online RL (the MAGRPO family, IAC, MAAC): trained by the segment loop, so its plan has end keys.
    The preference algorithms chain their own stages (candidates, pairs, DPO or a reward model, rounds)."""
    return cfg.algorithm in ALGORITHM_ADVANTAGE or is_actor_critic(cfg)


@dataclass(frozen=True)
class Update:
    """One policy update: its global index, epoch, training item ids and planned env_step before it.

    The planned env_step assumes full trees; with early termination the run-time count is lower.
    """

    index: int
    epoch: int
    item_ids: tuple[int, ...]
    env_step_base: int


def plan_updates(n_items: int, epochs: int, buffer: int, joint_actions_per_item: int,
                 nodes_per_item: int = 1) -> list[Update]:
    """Every update of the run, in order: the fewest whole trees holding >= `buffer` node samples each."""
    out, env = [], 0
    per = max(1, -(-buffer // nodes_per_item))
    for e in range(epochs):
        for start in range(0, n_items, per):
            ids = tuple(range(start, min(n_items, start + per)))
            out.append(Update(len(out), e, ids, env))
            env += len(ids) * joint_actions_per_item
    return out


def plan_segments(updates: list[Update], checkpoint_every: int) -> list[list[Update]]:
    """Split updates into checkpointed segments (0 = one segment per epoch)."""
    segs: list[list[Update]] = []
    for u in updates:
        new = not segs or (checkpoint_every and len(segs[-1]) >= checkpoint_every) or \
            (not checkpoint_every and segs[-1][-1].epoch != u.epoch)
        if new:
            segs.append([])
        segs[-1].append(u)
    return segs


@dataclass(frozen=True)
class RunPlan:
    """The immutable plan of a run: start key, updates, segments, the key each segment ends at, the
    budget and planning warnings."""

    start_key: str
    updates: tuple[Update, ...]
    segments: tuple[tuple[Update, ...], ...]
    budget: budget.Budget
    warnings: tuple[str, ...] = ()
    end_keys: tuple[str, ...] = ()  # checkpoint key (= policy version key) at the end of every segment (online RL)
    steps_keys: tuple[str, ...] = ()  # key of every segment's steps manifest (online RL)
    metrics_keys: tuple[str, ...] = ()  # key of every segment's metric rows under this run's logging (online RL)
