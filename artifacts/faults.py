"""Fault injection for the reliability tests: `COOPFLOW_FAULT=<point>[@N]` makes this process SIGKILL itself
the N-th time (default 1st) it reaches `<point>` — e.g. `commit:checkpoint` (an artifact written, not yet
renamed into place), `checkpoint-write` (on the writer thread of a checkpoint written beside the next segment),
`generate@3`, `update`, `mlflow-log`. A point may name who reaches it after a slash (`checkpoint-write/agent0`):
the spec `checkpoint-write` then matches every agent's, `checkpoint-write/agent0` only agent 0's (in
`parallel_training: mp` every worker process inherits the spec). Unset, `hit` costs one dict lookup."""

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
    if point != name and not point.startswith(name + "/"):
        return
    _SEEN[name] += 1
    if _SEEN[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
