"""A run whose process was killed leaves no MLflow run RUNNING forever: the rerun continues it (issue 20)."""

import subprocess
import sys

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.planning.context import make_context
from coopflow.stages.tasks.taskset import build_taskset
from tests.conftest import small_config


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_a_killed_runs_mlflow_run_is_continued_and_older_ones_closed(tmp_path, prefect_harness):
    from coopflow.flows.tracking import owner_tags, tracker_for
    from coopflow.flows.train import FLOWS

    data = small_config(tmp_path)
    cfg = validate_config(data, "magrpo")
    store = ArtifactStore(tmp_path / "artifacts")
    run_key = make_context(cfg, store, build_taskset(cfg.taskset, store)).run_key
    tracker = tracker_for(cfg)
    host = owner_tags()["coopflow.host"]
    ids = []
    for pid in (_dead_pid(), _dead_pid()):  # two earlier attempts, both killed (RUNNING forever before)
        run = tracker.client.create_run(tracker.experiment_id, run_name="killed",
                                        tags={"coopflow.run_key": run_key, "coopflow.host": host,
                                              "coopflow.pid": str(pid)})
        ids.append(run.info.run_id)
    alive = tracker.client.create_run(tracker.experiment_id, run_name="still running elsewhere",
                                      tags={"coopflow.run_key": run_key, "coopflow.host": host,
                                            "coopflow.pid": str(__import__("os").getpid())}).info.run_id
    out = FLOWS["train-magrpo"](config=data)
    assert out["mlflow_run_id"] == ids[-1]  # the newest killed attempt is continued
    get = tracker.client.get_run
    assert get(ids[-1]).info.status == "FINISHED" and get(ids[-1]).data.tags["coopflow.resumed_after_kill"] == "true"
    assert get(ids[0]).info.status == "KILLED"
    assert get(alive).info.status == "RUNNING"  # a live process's run is never taken over
    again = FLOWS["train-magrpo"](config=data)  # nothing dead any more: a rerun gets a run of its own
    assert again["mlflow_run_id"] not in ids + [alive]


def test_mlflow_writes_retry_while_the_database_is_locked(tmp_path, monkeypatch):
    """Concurrent runs on one SQLite tracking store: a write that meets `database is locked` is retried."""
    import coopflow.flows.tracking as T

    calls, waits = [], []
    monkeypatch.setattr(T.time, "sleep", waits.append)

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"

    assert T.Tracker._call(flaky, 1) == "ok" and len(calls) == 3 and waits == [0.1, 0.2]

    def broken(*args, **kwargs):
        raise RuntimeError("no such table: runs")

    import pytest

    with pytest.raises(RuntimeError, match="no such table"):  # other errors are not retried
        T.Tracker._call(broken)


def test_metric_names_mlflow_refuses_are_logged_under_safe_names(tmp_path):
    """The coding environment's `eval/pass@1`: MLflow refuses `@` in a metric name (the whole batch failed and
    with it the run); the tracker logs it as `eval/pass_at_1` and other refused characters as `_`."""
    import coopflow.flows.tracking as T

    assert T.metric_name("eval/pass@1") == "eval/pass_at_1"
    assert T.metric_name("eval_before/main/defines-entry rate:x.y") == "eval_before/main/defines-entry rate:x.y"
    assert T.metric_name("reward(mean)") == "reward_mean_"
    tracker = T.tracker_for(validate_config(small_config(tmp_path)))
    run_id = tracker.start("names", {}, {})
    tracker.log_metrics([{"key": "eval/pass@1", "value": 0.5, "env_step": 3},
                         {"key": "eval_before/pass@5", "value": 0.25, "env_step": 0}])
    tracker.finish(True)
    logged = tracker.client.get_run(run_id).data.metrics
    assert logged == {"eval/pass_at_1": 0.5, "eval_before/pass_at_5": 0.25}
