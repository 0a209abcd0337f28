"""Loading user code named in configs: import paths ('module:function') and in-process functions.

Configs name user functions (rewards, processors, formatters, transitions, eval hooks, metrics
callbacks) by import path so a flow served by a deployment can load them in another process. The
Python API passes functions instead: `register_callable(fn)` names one 'mem:<fingerprint>' (a hash of
its qualified name and source, so editing the function changes every artifact key that used it), and
only this process can resolve that name.
"""

import hashlib
import importlib
import inspect
from collections.abc import Callable

_IN_MEMORY: dict[str, Callable] = {}


def callable_fingerprint(fn: Callable) -> str:
    """sha256 (16 hex) of a function's qualified name and source (its repr when it has no source)."""
    target = getattr(fn, "func", fn)  # functools.partial: the wrapped function + its bound arguments
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        src = repr(target)
    extra = repr((getattr(fn, "args", ()), sorted(getattr(fn, "keywords", {}).items()))) if target is not fn else ""
    code = getattr(target, "__code__", None)
    if code is not None:  # two lambdas on one source line differ in their code and constants
        extra += f"\n{code.co_code.hex()}\n{code.co_consts!r}\n{code.co_names!r}"
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    return hashlib.sha256(f"{name}\n{src}\n{extra}".encode()).hexdigest()[:16]


def register_callable(fn: Callable) -> str:
    """Make an in-process function usable where configs take an import path: returns 'mem:<fingerprint>'.

    The fingerprint (qualified name + source) goes into artifact keys, so editing the function
    invalidates what it produced. Only this process can resolve the name (flows served by
    deployments need import paths)."""
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__name__}")
    name = f"mem:{callable_fingerprint(fn)}"
    _IN_MEMORY[name] = fn
    return name


def register_object(obj) -> str:
    """Make an in-process object (e.g. a centralized adapter instance) usable where configs take an import path:
    'mem:<fingerprint>' of its class's qualified name and source plus its attributes' repr."""
    if isinstance(obj, type) or callable(obj):
        return register_callable(obj)
    state = repr(sorted((k, repr(v)) for k, v in vars(obj).items())) if hasattr(obj, "__dict__") else ""
    name = f"mem:{callable_fingerprint(type(obj))}{hashlib.sha256(state.encode()).hexdigest()[:8]}"
    _IN_MEMORY[name] = obj
    return name


_OLD_PARTS = ("stages", "flows", "schemas", "artifacts")


def moved_path(path: str) -> str | None:
    """The current import path of a path into coopflow's code as it was named before coopflow became one package
    (`stages.tasks.envs.coding:humaneval_reward` -> `coopflow.envs.coding:humaneval_reward`); None for any other
    path. Checked before importing: from a checkout's root the old folders would still import, a second time."""
    head = path.split(":", 1)[0].split(".", 1)[0]
    if head not in _OLD_PARTS:
        return None
    mod, sep, attr = path.partition(":")
    if mod.startswith("stages.tasks.envs."):
        new = "coopflow.envs." + mod.removeprefix("stages.tasks.envs.")
    elif mod == "stages.score.rewards" and attr == "length_ratio":
        new = "coopflow.rewards"
    elif mod == "stages.tasks.centralized" and attr in ("DelimitedAdapter", "TaggedAdapter"):
        new = "coopflow.centralized"
    else:
        new = "coopflow." + mod
    return new + sep + attr


def load_callable(path: str, what: str = "function") -> Callable:
    """Import 'module:attr' (or 'module.attr'); clear error when it is not there."""
    if path.startswith("mem:"):
        if path not in _IN_MEMORY:
            raise ValueError(f"{what} {path!r} is an in-process function of another Python process; pass an "
                             "import path 'module:function' to use it here")
        return _IN_MEMORY[path]
    mod_name, sep, attr = path.partition(":")
    if not sep:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"{what} {path!r} must be a built-in name or an import path 'module:function'")
    moved = moved_path(path)
    if moved:
        raise ValueError(f"{what} {path!r} names coopflow's code by an old path: use {moved!r}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as err:
        raise ValueError(f"{what} {path!r}: cannot import module {mod_name!r} ({err})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"{what} {path!r}: module {mod_name!r} has no callable {attr!r}")
    return fn
