"""Reward functions used by tests through the `module:function` import path."""

import time

from stages.rewards import length_ratio


def slow_length_ratio(c1, c2):
    """length_ratio, but slow enough that a test can kill the process mid-training."""
    time.sleep(0.05)
    return length_ratio(c1, c2)


def loose_length_ratio(c1, c2):
    """A different reward (ratio 1–1.5 is best) for re-scoring tests."""
    return length_ratio(c1, c2, lo=1.0, hi=1.5)


def near_forty_chars(completions):
    """Single-agent reward (GRPO): 1 at 40 characters, falling off linearly."""
    return [max(0.0, 1.0 - abs(len(c) - 40) / 40) for c in completions]
