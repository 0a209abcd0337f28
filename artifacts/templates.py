"""Files created from a cached template: build the template once, then every new target is a copy.

Used for MLflow's SQLite tracking DB: creating one runs ~3 s of schema migrations, while copying a
migrated, empty DB takes milliseconds. The template is built (by a caller-supplied function) into a
temp file and renamed into place; each target is copied to a temp file beside it and renamed, so
concurrent processes never see a half-written file and an existing target is never touched.
"""

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def _tmp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def create_from_template(target: Path, template: Path, build: Callable[[Path], None],
                         adapt: Callable[[Path], None] | None = None) -> bool:
    """Create `target` as a copy of `template` (built by `build(path)` when missing); `adapt(path)` edits the
    copy before it is renamed into place. Returns False, doing nothing, when `target` already exists."""
    target, template = Path(target), Path(template)
    if target.exists():
        return False
    if not template.is_file():
        template.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_beside(template)
        try:
            build(tmp)
            os.replace(tmp, template)  # a concurrent builder's identical template may win: fine
        finally:
            tmp.unlink(missing_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_beside(target)
    try:
        shutil.copyfile(template, tmp)
        if adapt is not None:
            adapt(tmp)
        if target.exists():  # another process created it meanwhile: keep theirs
            return False
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return True
