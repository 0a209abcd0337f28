"""Code identity: a digest of the code a result was computed by, for artifact keys.

A cached artifact may be served only while the code that computed it is unchanged. Comparing a function's own
source is not enough: a reward's logic often lives in a helper of the same module, or in another module of the
user's package. So the identity of a callable (a reward, a formatter, a transition, an evaluation hook, ...) is
the digest of a *module closure*:

- start at the module that defines the callable;
- parse it and follow every import it makes (at the top, inside functions, relative or absolute) to the
  modules that are code being developed: the user's own files and coopflow's;
- hash each such module's syntax tree with its docstrings removed, so comments, docstrings and formatting never
  change an identity, while any edit of what the code does changes it;
- record a module of an installed distribution (numpy, transformers, a package installed from PyPI) by the
  distribution's name and version, without reading it; the standard library is left out. coopflow's own modules
  count coopflow's required distributions (torch, transformers, ...) and what they import at module level, not the
  optional extras they import inside a function where used (ray, peft, ...): installing an extra recomputes
  nothing.

coopflow's own artifact kinds are identified the same way (`stage_code.kind_code`): the modules that compute a
kind are declared once (`coopflow.stages.common.stage_code.CODE`) and the digest of their closure enters that
kind's key.
The closure does not go on from the *orchestration* modules (the loops and the planning), which import every
stage: a loop's own code counts for the kinds it computes, the stages it calls count through their own roots.

Digests are computed from the files on disk (each file's parsed digest is cached by its content hash, each closure
by its files' stats), once per run (`planning()`): an edit made while a Python process runs counts the next time
that process plans a run, and a module edited after the process imported it is refused (`StaleModuleError`).
"""

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Iterable
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from coopflow.stages.common.syntax import parse

__all__ = ["callable_identity", "module_closure", "code_digest", "planning", "StaleModuleError"]

ORCHESTRATION = ("coopflow.stages.loops", "coopflow.stages.planning", "coopflow.flows", "coopflow.stages.operations")
"""Packages whose modules count as themselves only: their imports are not followed (they import every stage)."""

EXCLUDED = ("coopflow.artifacts",)
"""coopflow's packages that never count: the store keeps what stages compute and does not change it (the format of
what it writes is versioned by `coopflow.schemas.tables.SCHEMA_VERSION`, checked when an artifact is read)."""

_PARSED: dict[str, tuple[str, tuple[tuple[int, str, tuple[str, ...], bool], ...]]] = {}
"""sha256 of a file's bytes -> (digest of its normalized syntax tree, its imports as (level, module, names, whether
the import runs when the module is imported rather than inside a function))."""


# --- classifying modules ----------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories of the standard library, directories of installed distributions)."""
    import site

    paths = sysconfig.get_paths()
    sites = {paths.get("purelib"), paths.get("platlib")}
    sites.update(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        sites.add(user)
    sites = {str(Path(s).resolve()) for s in sites if s}
    std = {str(Path(p).resolve()) for p in (paths.get("stdlib"), paths.get("platstdlib")) if p}
    return tuple(sorted(std)), tuple(sorted(sites))


def _under(path: str, dirs: Iterable[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@lru_cache(maxsize=None)
def _distribution(top: str) -> str:
    """'name==version' of the installed distribution that provides top-level module `top`."""
    try:  # most distributions are named as their module (a full scan of installed ones takes ~0.5 s)
        return f"{top}=={importlib.metadata.version(top)}"
    except importlib.metadata.PackageNotFoundError:
        pass
    names = _distributions().get(top) or [top]
    out = []
    for name in sorted(set(names)):
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}==?")
    return ",".join(out)


@lru_cache(maxsize=1)
def _required() -> frozenset[str]:
    """Normalized names of coopflow's required distributions (not those of its extras)."""
    import re

    try:
        reqs = importlib.metadata.requires("coopflow") or []
    except importlib.metadata.PackageNotFoundError:
        return frozenset()
    return frozenset(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-")
                     for r in reqs if "extra ==" not in r)


def _is_extra(name: str) -> bool:
    """Whether module `name` belongs to an installed distribution that coopflow does not require."""
    kind, where = _classify(name)
    if kind != "dist":
        return False
    names = {d.split("==")[0].lower().replace("_", "-") for d in where.split(",")}
    return not names & _required()


def _find(name: str):
    """The module spec of `name`, or None (never raises: a broken parent import counts as not found)."""
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__spec__", None) is not None:
        return mod.__spec__
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None


def _classify(name: str) -> tuple[str, str | None]:
    """('code', file) for a module being developed (coopflow's or the user's), ('dist', 'name==version') for one of
    an installed distribution, ('std', None) for the standard library or a built-in, ('missing', None) when it
    cannot be found."""
    top = name.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return "std", None
    top_spec = _find(top)
    if top_spec is None:
        return "missing", None
    std, sites = _library_dirs()
    top_origin = _origin(top_spec)
    if top != "coopflow" and top_origin is not None and _under(top_origin, sites):
        return "dist", _distribution(top)  # (never looks inside: a submodule spec would import the package)
    spec = top_spec if name == top else _find(name)
    origin = _origin(spec) if spec is not None else None
    if origin is None:
        return ("std", None) if spec is not None else ("missing", None)
    if _under(origin, std) and not _under(origin, sites):
        return "std", None
    if not origin.endswith(".py"):
        return "dist", _distribution(top)  # an extension module outside site-packages: identify it by its package
    return "code", origin


def _origin(spec) -> str | None:
    origin = getattr(spec, "origin", None)
    return None if not origin or origin in ("built-in", "frozen") else _resolved(origin)


@lru_cache(maxsize=4096)
def _resolved(origin: str) -> str | None:
    """The resolved path of a module's file (None when it is not a file)."""
    return str(Path(origin).resolve()) if os.path.isfile(origin) else None


# --- parsing one module -----------------------------------------------------------------------------


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _parse(path: str) -> tuple[str, tuple]:
    """(digest of the file's syntax tree without docstrings, the imports it makes anywhere in it)."""
    raw = _read(path)
    h = hashlib.sha256(raw).hexdigest()
    if h in _PARSED:
        return _PARSED[h]
    try:
        tree = parse(raw, filename=path)
    except (SyntaxError, ValueError):  # not Python we can parse: its bytes identify it
        _PARSED[h] = (h[:16], ())
        return _PARSED[h]
    imports = []
    stack = [(tree, True)]
    while stack:  # (node, whether it runs when the module is imported: not inside a function)
        node, top = stack.pop()
        if isinstance(node, ast.Import):
            imports.extend((0, a.name, (), top) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.level, node.module or "", tuple(a.name for a in node.names), top))
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
    dump = ast.dump(_strip_docstrings(tree), annotate_fields=False, include_attributes=False)
    _PARSED[h] = (hashlib.sha256(dump.encode()).hexdigest()[:16], tuple(imports))
    return _PARSED[h]


class StaleModuleError(RuntimeError):
    """A module was edited after this process imported it: a run now would compute with the old code under a key
    that names the new code."""


_LOADED: dict[str, tuple[int, str]] = {}
"""module name -> (id of the module's spec when first digested, that digest): importlib.reload makes a new spec."""


def _check_loaded(name: str, digest: str) -> None:
    """Refuse to identify an imported module by code it is not running (edited on disk after import, not reloaded)."""
    mod = sys.modules.get(name)
    spec = getattr(mod, "__spec__", None) if mod is not None else None
    if spec is None:
        return  # not imported yet: it will be imported from the file the digest read
    first = _LOADED.get(name)
    if first is None or first[0] != id(spec):
        _LOADED[name] = (id(spec), digest)
    elif first[1] != digest:
        raise StaleModuleError(f"module {name} was edited after this process imported it: its results would be "
                               f"computed by the old code; restart the process (or importlib.reload({name}))")


def _package_of(name: str, path: str) -> str:
    return name if Path(path).name == "__init__.py" else name.rpartition(".")[0]


def _targets(name: str, path: str, imp: tuple) -> list[str]:
    """Module names one import statement of module `name` may load (for `from m import x`: m, and m.x when m is a
    package of code being developed, where x may be a submodule)."""
    level, module, names = imp[:3]
    if level:
        pkg = _package_of(name, path)
        try:
            base = importlib.util.resolve_name("." * level + module, pkg) if pkg else None
        except (ImportError, ValueError):
            base = None
        if base is None:
            return []
    else:
        base = module
    if not names:
        return [base]
    out = [base]
    spec = _find(base) if _classify(base)[0] == "code" else None
    if spec is not None and spec.submodule_search_locations is not None:  # a package: x may be a submodule
        out += [f"{base}.{n}" for n in names if n != "*"]
    return out


# --- closures and identities ------------------------------------------------------------------------


_CLOSURES: dict[tuple, tuple[tuple, dict[str, str]]] = {}
"""(roots, stop) -> (`_stat` of every module read, the closure): reused while no file changed and no module was
imported anew (a reload, or another file under the same name)."""


def _stat(name: str, path: str) -> tuple:
    mod = sys.modules.get(name)
    spec = id(mod.__spec__) if mod is not None and getattr(mod, "__spec__", None) is not None else None
    try:
        st = os.stat(path)
        return name, path, spec, st.st_mtime_ns, st.st_size
    except OSError:
        return name, path, spec, None, None


_PLANNING: list[set] = []
"""While a run plans its keys (`planning()`): the closures already checked against the files in this pass."""


@contextmanager
def planning():
    """Within this block a closure checked once against its files is reused without checking again: the keys of
    one plan (hundreds of updates, each naming the same code) see one state of the code, at a fraction of the cost."""
    _PLANNING.append(set())
    try:
        yield
    finally:
        _PLANNING.pop()


def module_closure(roots: Iterable[str], stop: tuple[str, ...] = ORCHESTRATION) -> dict[str, str]:
    """{module or 'dist:<name>': digest or version} of the code `roots` run: every module being developed they
    import, transitively (not going on from modules under `stop`, whose own code still counts), and the installed
    distributions those import. A root that cannot be found is recorded as missing."""
    memo_key = (tuple(roots), stop)
    found = _CLOSURES.get(memo_key)
    if found is not None and _PLANNING and memo_key in _PLANNING[0]:
        return found[1]
    if found is not None and all(_stat(*f[:2]) == f for f in found[0]):
        if _PLANNING:
            _PLANNING[0].add(memo_key)
        return found[1]
    out: dict[str, str] = {}
    files: list[tuple[str, str]] = []
    todo = [(r, True) for r in memo_key[0]]
    seen: set[str] = set()
    while todo:
        name, is_root = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        kind, where = _classify(name)
        if kind == "dist":
            out[f"dist:{where}"] = where
            continue
        if kind == "missing":
            if is_root:
                out[name] = "missing"
            continue
        if kind == "std" or any(name == e or name.startswith(e + ".") for e in EXCLUDED):
            continue
        files.append((name, where))
        digest, imports = _parse(where)
        _check_loaded(name, digest)
        out[name] = digest
        if "." in name:  # a submodule runs its packages' __init__ first
            todo.append((name.rpartition(".")[0], False))
        if any(name == s or name.startswith(s + ".") for s in stop):
            continue
        own = name == "coopflow" or name.startswith("coopflow.")
        for imp in imports:
            for target in _targets(name, where, imp):
                if own and not imp[3] and _is_extra(target):
                    continue  # coopflow imports optional extras (ray, peft, ...) where used: installing one changes nothing
                todo.append((target, False))
    out = dict(sorted(out.items()))
    _CLOSURES[memo_key] = (tuple(_stat(*f) for f in files), out)
    if _PLANNING:
        _PLANNING[0].add(memo_key)
    return out


def code_digest(roots: Iterable[str], stop: tuple[str, ...] = ORCHESTRATION) -> str:
    """One digest (16 hex) of `module_closure(roots)`."""
    closure = module_closure(roots, stop)
    return hashlib.sha256(repr(sorted(closure.items())).encode()).hexdigest()[:16]


def _target(obj):
    """The function or class whose module defines what `obj` does (partials, bound methods, instances)."""
    while hasattr(obj, "func") and callable(getattr(obj, "func")):  # functools.partial
        obj = obj.func
    obj = getattr(obj, "__func__", obj)  # bound method
    if not (isinstance(obj, type) or hasattr(obj, "__code__")):
        obj = type(obj)  # a callable instance: its class's module
    return obj


def callable_identity(obj) -> str:
    """Digest (16 hex) of the code `obj` runs: the closure of its defining module (see the module docstring). A
    function defined where no file holds it (an interactive session) is identified by its own source, or failing
    that by its compiled code."""
    target = _target(obj)
    module = getattr(target, "__module__", None) or ""
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None) if mod is not None else None
    if module == "__main__" and path and Path(path).is_file():  # a script: its file, then what it imports
        digest, imports = _parse(str(Path(path).resolve()))
        deps = {}
        for imp in imports:
            for name in _targets("__main__", path, imp) if imp[0] == 0 else []:
                deps.update(module_closure([name]))
        return hashlib.sha256(repr((digest, sorted(deps.items()))).encode()).hexdigest()[:16]
    if module and module != "__main__" and path and Path(path).is_file():
        return code_digest([module])
    import inspect

    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        src = f"{code.co_code.hex()}{code.co_consts!r}{code.co_names!r}" if code is not None else repr(target)
    return hashlib.sha256(f"{module}\n{src}".encode()).hexdigest()[:16]
