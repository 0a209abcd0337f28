"""Freed memory kept in the process for the next pass instead of handed back to the kernel (glibc malloc).

A training pass allocates and frees the same large buffers every time: logits over the vocabulary, their
gradient, the tied embedding's dense gradient, activations (tens to hundreds of MB each). glibc serves a block
above its mmap threshold (at most 32 MB) with fresh pages from the kernel and unmaps it on free, and it trims
free memory at the heap's top, so every pass touches new pages again: a page fault and the kernel's zeroing per
4 KB, gigabytes of them per policy-loss pass of a 135M-parameter model. `keep_freed_memory` turns both off
(mallopt: no mmap'd blocks, no trimming): blocks come from the heap and freed ones are reused by the next pass.
The process's resident memory then stays at its high-water mark (its peak, which a run needs anyway) instead of
shrinking between passes.

Applied in the processes a run owns (agent workers, Ray actors, the CLI's and deployments' run processes), not
in a Python API user's process. `COOPFLOW_KEEP_FREED_MEMORY=0` leaves malloc as it is; so does an exported glibc
setting of the same knobs (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_, ... or glibc.malloc.* in GLIBC_TUNABLES),
which is the user's own choice.
"""

import ctypes
import ctypes.util
import os
import sys

__all__ = ["keep_freed_memory"]

# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

_applied = False

# glibc's environment variables for the two settings this changes (and the mmap threshold and top pad beside them)
_GLIBC_KNOBS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _user_tuned() -> str | None:
    """The environment variable by which the user tuned or opted out of this, if any."""
    if os.environ.get("COOPFLOW_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return "COOPFLOW_KEEP_FREED_MEMORY"
    for name in _GLIBC_KNOBS:
        if name in os.environ:
            return name
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory() -> str:
    """Have this process's malloc keep freed memory for reuse (see the module docstring); what was done, in words.
    Idempotent; a no-op off Linux/glibc."""
    global _applied
    if _applied:
        return "kept (already)"
    if not sys.platform.startswith("linux"):
        return f"left as it is ({sys.platform}: not glibc)"
    user = _user_tuned()
    if user is not None:
        return f"left as it is ({user} is set)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "left as it is (no glibc mallopt)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, -1) != 1:  # -1: never trim (mallopt(3))
        return "left as it is (mallopt refused)"
    _applied = True
    return "kept for reuse (no mmap'd blocks, no heap trimming)"
