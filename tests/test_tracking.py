"""flows.tracking: the tracker's batching of its first writes and its tables."""

import json

import pytest

from coopflow.flows.tracking import Tracker


def _tracker(tmp_path):
    return Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "x", True, artifact_location=(tmp_path / "art").as_uri())


def test_a_new_run_gets_its_queued_tags_with_its_params(tmp_path, monkeypatch):
    tr = _tracker(tmp_path)
    calls = []
    real = tr.client.log_batch
    monkeypatch.setattr(tr.client, "log_batch", lambda *a, **k: calls.append(k) or real(*a, **k))
    tr.tag({"lineage.taskset": "taskset/abc@123"})
    run_id = tr.start("r", {"coopflow.run_key": "k"}, {"a": 1, "b": {"c": [1, 2]}})
    tr.flush()  # nothing queued: no call
    tr.drain()
    assert len(calls) == 1 and not tr._tags
    run = tr.client.get_run(run_id)
    assert run.data.tags["lineage.taskset"] == "taskset/abc@123" and run.data.tags["coopflow.run_key"] == "k"
    assert run.data.params == {"a": "1", "b.c": "[1, 2]"}


def test_writes_run_behind_the_flow_in_order_and_finish_waits_for_them(tmp_path, monkeypatch):
    """log_metrics returns while its write is still held back; finish sends it, in order, before FINISHED."""
    import threading

    tr = _tracker(tmp_path)
    run_id = tr.start("r", {}, {"a": 1})
    gate, real = threading.Event(), tr.client.log_batch

    def held(*a, **k):
        assert gate.wait(30), "the writer was never released"
        return real(*a, **k)

    monkeypatch.setattr(tr.client, "log_batch", held)
    tr.log_metrics([{"key": "m", "value": 1.0, "env_step": 1}])
    tr.log_metrics([{"key": "m", "value": 2.0, "env_step": 2}])
    tr.log_files({"summary.json": {"ok": True}})
    assert tr.client.get_run(run_id).data.metrics == {}  # nothing written yet: the flow did not wait
    gate.set()
    tr.finish(True)
    run = tr.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in tr.client.get_metric_history(run_id, "m")] == [(1, 1.0), (2, 2.0)]
    assert [a.path for a in tr.client.list_artifacts(run_id)] == ["summary.json"]


def test_a_failed_write_fails_the_run_and_is_raised(tmp_path, monkeypatch):
    tr = _tracker(tmp_path)
    run_id = tr.start("r", {}, {"a": 1})
    tr.drain()

    def broken(*a, **k):
        raise OSError("disk gone")

    monkeypatch.setattr(tr.client, "log_batch", broken)
    tr.log_metrics([{"key": "m", "value": 1.0, "env_step": 1}])
    with pytest.raises(OSError, match="disk gone"):
        tr.finish(True)
    assert tr.client.get_run(run_id).info.status == "FAILED"


def test_a_run_already_failing_keeps_its_own_error(tmp_path, monkeypatch, caplog):
    tr = _tracker(tmp_path)
    run_id = tr.start("r", {}, {"a": 1})
    tr.drain()
    monkeypatch.setattr(tr.client, "log_batch", lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    tr.log_metrics([{"key": "m", "value": 1.0, "env_step": 1}])
    tr.finish(False)  # no raise: the flow's own exception is the one to see
    assert tr.client.get_run(run_id).info.status == "FAILED"
    assert "disk gone" in caplog.text


def test_a_failed_write_surfaces_at_the_next_write(tmp_path, monkeypatch):
    tr = _tracker(tmp_path)
    tr.start("r", {}, {"a": 1})
    tr.drain()
    monkeypatch.setattr(tr.client, "log_inputs", lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    from coopflow.artifacts import ArtifactRef

    tr.log_dataset("d", ArtifactRef(kind="taskset", key="k", sha256="0" * 64, uri="file:///x", rows=1))
    tr._pending[-1].exception()  # let it fail
    with pytest.raises(OSError, match="disk gone"):
        tr.log_metrics([{"key": "m", "value": 1.0, "env_step": 1}])


def test_logging_a_dataset_another_run_inserted_at_the_same_moment_is_retried(tmp_path, monkeypatch):
    """Two runs logging one taskset at once: the slower insert breaks MLflow's datasets unique key; the retry
    finds the row the other run wrote and links it."""
    from mlflow.exceptions import MlflowException

    from coopflow.artifacts import ArtifactRef

    tr = _tracker(tmp_path)
    run_id = tr.start("r", {}, {"a": 1})
    real, calls = tr.client.log_inputs, []

    def racing(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest")
        return real(*a, **k)

    monkeypatch.setattr(tr.client, "log_inputs", racing)
    tr.log_dataset("taskset-x", ArtifactRef(kind="taskset", key="k", sha256="ab" * 32, uri="taskset/k", rows=1))
    tr.finish(True)
    assert len(calls) == 2
    assert [d.dataset.name for d in tr.client.get_run(run_id).inputs.dataset_inputs] == ["taskset-x"]


def test_a_table_logged_again_is_replaced_and_listed_once_also_by_a_continued_run(tmp_path):
    tr = _tracker(tmp_path)
    run_id = tr.start("r", {}, {})
    tr.log_tables({"rollouts/segment_0001.json": (["update", "reward"], [[0, 0.5], [1, 0.75]])})
    tr.log_tables({"rollouts/segment_0001.json": (["update", "reward"], [[0, 0.5], [1, 0.75]]),
                   "rollouts/eval.json": (["item_id", "reward"], [[3, 1.0]])})
    tr.finish(True)
    path = tr.client.download_artifacts(run_id, "rollouts/segment_0001.json", str(tmp_path / "dl"))
    assert json.loads(open(path).read()) == {"columns": ["update", "reward"], "data": [[0, 0.5], [1, 0.75]]}
    listed = json.loads(tr.client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert listed == [{"path": "rollouts/segment_0001.json", "type": "table"},
                      {"path": "rollouts/eval.json", "type": "table"}]
    again = _tracker(tmp_path)  # a resumed or continued run reopens the MLflow run
    again.start("r", {}, {}, run_id=run_id)
    again.log_tables({"rollouts/segment_0002.json": (["update"], [[2]])})
    again.finish(True)
    listed = json.loads(again.client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert [t["path"] for t in listed] == ["rollouts/segment_0001.json", "rollouts/eval.json",
                                          "rollouts/segment_0002.json"]
