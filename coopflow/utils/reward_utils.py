"""Reward helpers with the reference's names (`comlrl.utils.reward_utils`): declared ranges and the call dispatch."""

import math
from collections.abc import Callable, Sequence
from typing import Any

from coopflow.stages.score.rewards import RewardCaller, declared_range

__all__ = ["set_reward_range", "resolve_reward_range", "call_reward_function", "normalize_reward_lengths"]


def set_reward_range(reward_func: Callable, minimum: float, maximum: float) -> Callable:
    """Attach `reward_range = (minimum, maximum)` to `reward_func` (finite, minimum < maximum) and return it."""
    lo, hi = float(minimum), float(maximum)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"reward_func.reward_range must be finite, got ({minimum}, {maximum})")
    if not lo < hi:
        raise ValueError(f"reward_func.reward_range minimum must be less than maximum, got ({minimum}, {maximum})")
    reward_func.reward_range = (lo, hi)
    return reward_func


def resolve_reward_range(reward_func: Callable) -> tuple[float, float] | None:
    """The declared (min, max) of a reward function (also through functools.partial), or None."""
    return declared_range(reward_func)


def call_reward_function(reward_func: Callable, prompts: Sequence[str], agent_completions: Sequence[Sequence[str]], *,
                         num_agents: int, batch_items: Sequence[dict[str, Any]] | None = None,
                         signature=None) -> list[float]:
    """Call a reward function the way the trainers do (the signature dispatch of `stages.score.rewards`):
    agent_completions[i] is agent i's list of completions; returns the values as floats."""
    if len(agent_completions) != num_agents:
        raise ValueError(f"agent_completions has {len(agent_completions)} lists but num_agents is {num_agents}")
    caller = RewardCaller(reward_func, num_agents)
    return caller([list(c) for c in agent_completions], list(prompts), list(batch_items or [{}]))


def normalize_reward_lengths(rewards: Sequence[float], *, num_agents: int, num_generations: int,
                             algorithm: str) -> list[float]:
    """The rewards of one prompt as the actor-critic trainers take them: one shared value is broadcast to the
    N agents; N (one per agent) or K (one per generation) values are kept; anything else is an error."""
    vals = [float(r) for r in rewards]
    if num_agents <= 1:
        return vals
    if len(vals) == 1:
        return vals * num_agents
    if len(vals) in (num_agents, num_generations):
        return vals
    raise ValueError(f"Reward function must return either 1 or {num_agents} values per prompt for multi-agent "
                     f"{algorithm}; got {len(vals)}")
