"""Fault injection for the reliability tests: `COOPFLOW_FAULT=<point>[@N]` makes this process SIGKILL itself
the N-th time (default 1st) it reaches `<point>` — e.g. `commit:checkpoint` (an artifact written, not yet
renamed into place), `checkpoint-write` (on the writer thread of a checkpoint written beside the next segment),
`generate@3`, `update`, `mlflow-log`. Unset, `hit` costs one dict lookup."""

import os
import signal
from collections import Counter

__all__ = ["hit"]

_SEEN: Counter = Counter()


def hit(point: str) -> None:
    """Die here (SIGKILL, as `kill -9` would) when the environment asks for this point."""
    spec = os.environ.get("COOPFLOW_FAULT")
    if not spec:
        return
    name, _, nth = spec.partition("@")
    if name != point:
        return
    _SEEN[point] += 1
    if _SEEN[point] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
