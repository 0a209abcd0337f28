"""Parsing Python source into a syntax tree, safe beside other threads.

CPython 3.11 converts a parsed module into `ast` objects with one recursion counter per interpreter, reset at
the start of every conversion. When a garbage collection during one conversion runs Python code (a finalizer, a
weakref or gc callback) that parses too, or hands the interpreter to another thread that parses (Prefect's
heartbeat thread does, building its event models), the first conversion ends with a counter that is not its own
and fails with `SystemError: AST constructor recursion depth mismatch` (fixed in CPython 3.13). `parse` holds the
collector off while it converts, so nothing can run in between, and one parse of coopflow's runs at a time.
"""

import ast
import gc
import threading

__all__ = ["parse"]

_LOCK = threading.RLock()  # (re-entrant: a signal handler that parses cannot deadlock it)


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)` that no collection or other thread can interrupt midway."""
    with _LOCK:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source, filename=filename)
        finally:
            if enabled:
                gc.enable()
