"""Exports: copies of artifacts written outside the store where a user asked for them (e.g. the reference's
replay and checkpoint folders). Atomic: written beside the target under a temp name, then renamed over it."""

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["export_json", "export_tree"]


def export_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as JSON to `path` atomically (parents created)."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def export_tree(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the directory `src` to `dst`, replacing what was there only once the copy is complete."""
    d = Path(dst).expanduser()
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        old = None
        if d.exists():
            old = d.with_name(f".{d.name}.old-{os.getpid()}")
            os.replace(d, old)
        os.replace(tmp, d)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return d
