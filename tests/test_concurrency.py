"""Concurrency (issue 20), through `coopflow run` as users start it: two identical runs on one data dir at once
train once and log one MLflow run; two different runs at once both finish; the shared store stays intact."""

from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from tests.test_faults import _cli, _config, _summary, _weights

pytestmark = pytest.mark.slow


def _mlflow_runs(data: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{data / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _both(tmp_path: Path, first: dict, second: dict, data: Path) -> tuple[Path, Path]:
    logs = tmp_path / "a.log", tmp_path / "b.log"
    procs = [_cli("train-magrpo", cfg, data, log) for cfg, log in zip((first, second), logs)]
    for proc, log in zip(procs, logs):
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return logs


def test_two_identical_runs_at_once_train_once_and_log_one_mlflow_run(tmp_path):
    """The second starts while the first trains (its run-key lock held; a slow reward keeps it busy ~1 min)."""
    import time

    data = tmp_path / "data"
    cfg = {**_config(data, "magrpo"), "reward": {"name": "tests.helpers:delayed_length_ratio", "kwargs": {"delay": 5}}}
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = _cli("train-magrpo", cfg, data, a_log)
    t0 = time.time()
    while not list((data / "artifacts" / ".locks").glob("run-*.lock")):  # the first holds its run's lock
        assert a.poll() is None and time.time() - t0 < 300, a_log.read_text()[-3000:]
        time.sleep(0.2)
    b = _cli("train-magrpo", cfg, data, b_log)
    for proc, log in ((a, a_log), (b, b_log)):
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    assert "coopflow: torch threads 1 (OMP_NUM_THREADS)" in a_log.read_text()  # the chosen value, said at start
    assert _summary(a_log, "run_key") == _summary(b_log, "run_key")
    assert "'update'" in _summary(a_log, "executed") and _summary(b_log, "executed") == "{}"  # one trained
    runs = _mlflow_runs(data)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [(r.info.run_name, r.info.status) for r in runs]
    assert ArtifactStore(data / "artifacts").verify_all()[1] == []


def test_two_different_runs_at_once_both_finish(tmp_path):
    data = tmp_path / "data"
    cfg = _config(data, "magrpo")
    a, b = _both(tmp_path, cfg, {**cfg, "seed": 1}, data)
    assert _summary(a, "run_key") != _summary(b, "run_key")
    for log in (a, b):
        assert "'update'" in _summary(log, "executed")
        assert _weights(Path(_summary(log, "checkpoint")))
    runs = _mlflow_runs(data)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    assert ArtifactStore(data / "artifacts").verify_all()[1] == []
