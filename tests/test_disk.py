"""Disk faults (issue 20): a full disk and a read-only data dir end in one clear line, and nothing already stored
is lost or corrupted. Real filesystems: a size-limited tmpfs (mounting needs root; skipped otherwise) and, for the
read-only case without root, plain permissions."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from tests.conftest import small_config
from tests.test_faults import _weights

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size under tmp_path (unmounted afterwards)."""
    mounted = []

    def mount(where: Path, size: str) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip() or 'not root'})")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def _cli(config: dict, log: Path) -> int:
    cfg_file = log.with_suffix(".yaml")
    cfg_file.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI", "COOPFLOW_HOME", "COOPFLOW_FAULT")}
    with open(log, "a") as out:
        return subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config", str(cfg_file)],
                              cwd=REPO, stdout=out, stderr=out, env={**env, "OMP_NUM_THREADS": "1"},
                              timeout=900).returncode


def _digests(store: ArtifactStore) -> dict[str, str]:
    return {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())["sha256"]
            for p in store.root.glob("*/*/ref.json")}


def _config(data: Path) -> dict:
    return small_config(data, trainer={**small_config(data)["trainer"], "rollout_buffer_size": 1})


def test_a_full_disk_fails_in_one_line_keeps_the_store_and_the_rerun_continues(tmp_path, tmpfs):
    """The artifacts of a run on a 2 MiB tmpfs: the tiny model and the rollouts fit, the checkpoint does not."""
    data = tmp_path / "data"
    arts = tmpfs(data / "artifacts", "2m")
    cfg = _config(data)
    log = tmp_path / "full.log"
    t0 = time.time()
    assert _cli(cfg, log) == 4, log.read_text()[-3000:]
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("coopflow: no space left under") and "checkpoint artifact" in last, last
    assert "rerun the same command" in last
    store = ArtifactStore(arts)
    checked, bad = store.verify_all()
    assert checked > 0 and bad == []                    # what was stored before the disk filled still verifies
    assert not list(arts.rglob(".tmp-*"))               # the partial write is gone
    before = _digests(store)

    _remount(arts, "size=64m")                          # space freed: the same command continues
    assert _cli(cfg, log) == 0, log.read_text()[-3000:]
    after = _digests(store)
    assert {k: after[k] for k in before} == before      # nothing stored was rewritten
    # the same command uninterrupted, also as a CLI process started with one torch thread (bit-equal float sums
    # need the same thread setup from process start: set_num_threads(1) later is not the same as OMP_NUM_THREADS=1)
    assert _cli({**cfg, "data_dir": str(tmp_path / "clean")}, tmp_path / "clean.log") == 0
    clean = {p.name: p for p in (tmp_path / "clean" / "artifacts" / "checkpoint").iterdir() if (p / "ref.json").is_file()}
    assert clean and all(_weights(arts / "checkpoint" / name) == _weights(p) for name, p in clean.items())
    assert time.time() - t0 < 900


def test_a_read_only_data_dir_is_refused_in_seconds_and_left_as_it_was(tmp_path, tmpfs):
    """A stored run's data dir made read-only (a read-only remount; `chmod` when not root): refused before any
    Prefect server or model starts, naming the directory; every stored artifact unchanged."""
    from tests.helpers import run_stages as _run

    as_root = os.geteuid() == 0
    data = tmpfs(tmp_path / "data", "64m") if as_root else tmp_path / "data"
    cfg = _config(data)
    _run(validate_config(cfg), ArtifactStore(data / "artifacts"), False)
    store = ArtifactStore(data / "artifacts")
    before = _digests(store)
    if as_root:
        _remount(data, "ro")
    else:
        for p in [data, *data.rglob("*")]:
            p.chmod(p.stat().st_mode & 0o555)
    log = tmp_path / "ro.log"
    t0 = time.time()
    rc = _cli(cfg, log)
    elapsed = time.time() - t0
    if as_root:
        _remount(data, "rw")
    else:
        for p in [data, *data.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    text = log.read_text()
    assert rc == 2, text[-3000:]
    assert f"data_dir {data}: not writable" in text, text[-3000:]
    assert "Prefect" not in text and "Traceback" not in text
    assert elapsed < 60, f"refused only after {elapsed:.0f} s"
    assert _digests(store) == before and store.verify_all()[1] == []
