"""Exports: copies of artifacts written outside the store where a user asked for them (e.g. the reference's
replay and checkpoint folders). Atomic: written beside the target under a temp name, then renamed over it."""

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["export_json", "export_parquet", "export_dataset", "export_tree"]


def _atomic_file(path: str | os.PathLike, write) -> Path:
    """Let `write(tmp_path)` fill a temp file beside `path` (parents created), then rename it over `path`."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def export_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as JSON to `path` atomically (parents created)."""
    return _atomic_file(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=1, default=str)))


def export_parquet(path: str | os.PathLike, rows: list[dict], columns: tuple[str, ...]) -> Path:
    """Write `rows` (with exactly `columns`, in that order) as one Parquet file at `path` atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]) if rows else \
        pa.table({c: pa.array([], pa.string()) for c in columns})
    return _atomic_file(path, lambda tmp: pq.write_table(table.select(list(columns)), tmp))


def export_dataset(path: str | os.PathLike, rows: list[dict], columns: tuple[str, ...]) -> Path:
    """Write `rows` as a `datasets` directory (`Dataset.save_to_disk`, loadable with `datasets.load_from_disk`),
    replacing what was at `path` only once it is complete."""
    from datasets import Dataset

    d = Path(path).expanduser()
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
    try:
        Dataset.from_list([{c: r.get(c) for c in columns} for r in rows]).save_to_disk(str(tmp / "ds"))
        return export_tree(tmp / "ds", d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
