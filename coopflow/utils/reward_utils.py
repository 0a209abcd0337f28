"""`set_reward_range`: declare a reward function's range (used by reward-drift logs and turn warnings)."""

import math
from collections.abc import Callable

__all__ = ["set_reward_range"]


def set_reward_range(reward_func: Callable, min_value: float, max_value: float) -> Callable:
    """Attach `reward_range = (min, max)` to `reward_func` (finite, min < max) and return it."""
    lo, hi = float(min_value), float(max_value)
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise ValueError(f"reward_range must be finite with min < max, got ({min_value}, {max_value})")
    reward_func.reward_range = (lo, hi)
    return reward_func
