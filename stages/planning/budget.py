"""Pre-flight budget: what a config will cost, computed before any model loads.

Per training item and turn depth t (0-based), a tree of joint actions has
    aligned: K^t nodes        cross: (K^N)^t nodes
and every node asks each of the N agents for K samples and scores K (aligned) or K^N (cross) joint
actions, one reward call each. Generation is batched: one `generate` per agent per depth per update.
A depth is reached only if the previous one is (multi-turn); single turn is H = 1.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Budget:
    """Counts for the whole training run plus the final evaluation."""

    updates: int
    generate_calls: int
    sequences: int
    joint_actions: int
    reward_calls: int
    eval_sequences: int

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"{self.updates} updates, {self.generate_calls} generate calls, {self.sequences} sequences, "
                f"{self.joint_actions} joint actions ({self.reward_calls} reward calls), "
                f"{self.eval_sequences} eval sequences")


def tree_size(k: int, num_agents: int, num_turns: int, joint_mode: str, expansion: str = "all") -> tuple[int, int]:
    """(joint actions per node, nodes per item over all depths) of a full episode tree; with `expansion` 'best'
    only one joint action of a node continues, so an episode has one node per turn."""
    branch = k if (joint_mode == "aligned" or num_agents == 1) else k ** num_agents
    return branch, (num_turns if expansion == "best" else sum(branch ** t for t in range(num_turns)))


def estimate(n_items: int, n_eval_items: int, num_agents: int, k: int, num_turns: int, joint_mode: str,
             epochs: int, buffer: int, expansion: str = "all") -> Budget:
    """Upper-bound counts (no early termination) for a run over `n_items` training items."""
    n = num_agents
    branch, nodes = tree_size(k, n, num_turns, joint_mode, expansion)
    updates_per_epoch = -(-n_items // buffer)
    items = n_items * epochs
    return Budget(updates=updates_per_epoch * epochs,
                  generate_calls=updates_per_epoch * epochs * num_turns * n,
                  sequences=items * nodes * k * n,
                  joint_actions=items * nodes * branch,
                  reward_calls=items * nodes * branch,
                  eval_sequences=n_eval_items * num_turns * n)


class BudgetExceeded(ValueError):
    """The config implies more generated sequences than the configured limit."""


def check(budget: Budget, max_sequences: int) -> None:
    """Raise BudgetExceeded naming the counts and the knob when the run is larger than allowed."""
    if max_sequences and budget.sequences > max_sequences:
        raise BudgetExceeded(f"this config would generate {budget.sequences:,} sequences ({budget.describe()}), "
                             f"above max_sequences={max_sequences:,}; lower num_generations/num_turns/items, use "
                             "joint_mode: aligned, or raise max_sequences")


def unreachable_turns_warning(num_turns: int, threshold: float | None, reward_range: tuple | None) -> str | None:
    """Warn when early termination stops every branch after turn 1 for the reward's declared range."""
    if num_turns <= 1 or threshold is None or reward_range is None:
        return None
    lo = reward_range[0]
    if lo > threshold:
        return (f"early_termination_threshold={threshold} is below the reward's minimum {lo}: every node's mean "
                f"reward exceeds it, so no branch ever reaches turn 2 (num_turns={num_turns} does nothing); "
                "set early_termination_threshold: null or a value inside the reward range")
    return None


# --- disk --------------------------------------------------------------------------------------------

def human_bytes(n: float) -> str:
    """Bytes for people: 812 B, 3.4 kB, 12.3 MB, 3.10 GB (decimal units)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes a run writes into the store, estimated before anything loads (no early termination, nothing stored)."""

    checkpoints: int  # how many checkpoints the run writes
    full_bytes: int  # one checkpoint with optimizer state (weights + 2 AdamW moments per trained parameter)
    weights_bytes: int  # one weights-only checkpoint
    checkpoint_bytes: int  # what the run's checkpoints hold at its end
    peak_bytes: int  # the most on disk at once (a full checkpoint is written before its predecessor is slimmed)
    rollout_bytes: int  # rollouts, scores and learning signals (Parquet, an upper bound)

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + self.rollout_bytes

    def describe(self) -> str:
        h = human_bytes
        return (f"up to ~{h(self.total_bytes)} ({self.checkpoints} checkpoint(s) of {h(self.full_bytes)} with "
                f"optimizer state, {h(self.weights_bytes)} weights-only: {h(self.checkpoint_bytes)} kept at the end, "
                f"{h(self.peak_bytes)} at the peak; rollouts ~{h(self.rollout_bytes)})")


def estimate_disk(params: int, trained_params: int, weight_bytes: int, other_bytes: int, checkpoints: int,
                  keep_optimizer: str, sequences: int, bytes_per_sequence: int) -> DiskEstimate:
    """The disk a run writes: `params` stored parameters per checkpoint (every agent and critic) of which
    `trained_params` have AdamW state (two moments each, in the weights' dtype) plus `other_bytes` of tokenizer and
    config files, `checkpoints` of them kept as `keep_optimizer` says (all | last | none), and `sequences`
    generated rows of `bytes_per_sequence` (the rollout row and its share of scores and learning signals)."""
    w = params * weight_bytes + other_bytes
    opt = 2 * trained_params * weight_bytes
    full = w + opt
    c = max(1, checkpoints)
    if keep_optimizer == "all":
        end, peak = c * full, c * full
    elif keep_optimizer == "last":
        end = (c - 1) * w + full
        peak = end + (opt if c > 1 else 0)
    else:
        end, peak = c * w, c * w + opt
    return DiskEstimate(c, full, w, end, peak, sequences * bytes_per_sequence)
