"""Exclusive wall-time timers for the benchmark harnesses (coopflow's side and the peer's, same rules).

`timed(name, fn)` wraps a function; each call adds its wall time to `T[name]` minus the time of timed calls nested
inside it, so the totals of different names never count the same second twice. Standard library only: the
peer's venv imports it too.
"""
import functools
import time

T: dict[str, float] = {}
_stack: list[list] = []


def timed(name: str, fn):
    @functools.wraps(fn)
    def w(*a, **kw):
        _stack.append([name, time.perf_counter(), 0.0])
        try:
            return fn(*a, **kw)
        finally:
            n, t0, child = _stack.pop()
            dt = time.perf_counter() - t0
            T[n] = T.get(n, 0.0) + dt - child
            if _stack:
                _stack[-1][2] += dt
    return w
