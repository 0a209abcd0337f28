"""One run driver for every entry point: `trainer.train()` (the inline runner), the Prefect flows (`coopflow run`,
deployments) share the store (with its remote mirror), the run-key lock, MLflow resumption, lineage and tracking;
a `file://` remote mirror whose folder does not exist yet works."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import Dataset

from coopflow.artifacts import ArtifactStore
from tests.conftest import small_config
from tests.helpers import length_ratio

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"write a story about {t}" for t in ("a fox", "the moon", "rain", "a tree")]


def _trainer(model: str, data: Path, reward=length_ratio, **wandb):
    from coopflow.trainers import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, agent_learning_rate=1e-3, num_generations=2, max_new_tokens=8,
                        temperature=1.0, top_p=1.0, rollout_buffer_size=2, eval_interval=0, eval_num_samples=2)
    return MAGRPOTrainer(agent_model=model, num_agents=2, reward_func=reward, args=args, data_dir=str(data),
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}), wandb_config=wandb or None)


def _weights(ckpt: Path) -> dict[str, str]:
    return {str(p.relative_to(ckpt)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(ckpt.rglob("*.safetensors"))}


def _mlflow_runs(data: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{data / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _mirror_keys(url: str) -> set[tuple[str, str]]:
    from coopflow.artifacts.remote import RemoteMirror

    return set(RemoteMirror(url).keys())


# --- fast ------------------------------------------------------------------------------------------


def test_every_driver_step_has_its_prefect_task():
    """The flows' runner runs every step the driver names, each as the Prefect task (or subflow) of that name."""
    from coopflow.flows import driver
    from coopflow.flows.train import TASKS

    assert set(TASKS) == set(driver.STEPS)
    assert all(t.name == name for name, t in TASKS.items())


def test_a_file_mirror_whose_folder_does_not_exist_yet_publishes_and_serves(tmp_path):
    url = (tmp_path / "share" / "bucket").as_uri()  # file:///.../share/bucket: no such folder yet
    a = ArtifactStore(tmp_path / "a", url)
    t = a.put_table("metrics", "k1", [{"key": "loss", "value": 1.5, "env_step": 0}])
    d = a.put_dir("checkpoint", "c1", lambda p: ((p / "agent_0").mkdir(), (p / "agent_0" / "w.bin").write_bytes(b"w")))
    assert _mirror_keys(url) == {("metrics", "k1"), ("checkpoint", "c1")}
    b = ArtifactStore(tmp_path / "b", url)  # another machine's cache on the same share
    assert b.read_rows(t) == a.read_rows(t) and (b.open_dir(d) / "agent_0" / "w.bin").read_bytes() == b"w"


def test_every_store_of_a_config_honours_its_remote_mirror(tmp_path, monkeypatch):
    """`ArtifactStore.of(cfg)` / `.at(data_dir, cfg)` mirror as the config (or $COOPFLOW_REMOTE_STORE) says; a store
    opened for a bare data dir (verify, gc) stays local."""
    from coopflow.schemas.config import validate_config

    url = (tmp_path / "bucket").as_uri()
    monkeypatch.setenv("COOPFLOW_REMOTE_STORE", url)
    cfg = validate_config(small_config(tmp_path / "data"))
    for store in (ArtifactStore.of(cfg), ArtifactStore.at(tmp_path / "data", cfg)):
        assert store.root == (tmp_path / "data" / "artifacts").resolve() and store.remote.url == url
    assert ArtifactStore.at(tmp_path / "data").remote is None


def test_the_python_api_publishes_to_the_mirror_in_the_environment(tiny_model_dir, tmp_path, monkeypatch):
    """`trainer.train()` opens the run's store like a flow: $COOPFLOW_REMOTE_STORE (a file:// mirror not made yet)
    gets every artifact of the run, and the run is tracked with the run key and lineage tags."""
    url = (tmp_path / "mirror" / "runs").as_uri()
    monkeypatch.setenv("COOPFLOW_REMOTE_STORE", url)
    out = _trainer(str(tiny_model_dir), tmp_path / "data").train(show_progress=False)
    published = _mirror_keys(url)
    assert ("checkpoint", out["run_key"]) in published and any(kind == "eval" for kind, _ in published)
    local = set(ArtifactStore.at(tmp_path / "data").artifacts())
    assert local <= published, local - published  # nothing stored here is missing from the mirror
    (run,) = _mlflow_runs(tmp_path / "data")
    tags = run.data.tags
    assert tags["coopflow.run_key"] == out["run_key"] and tags["coopflow.entry"] == "python-api"
    assert run.info.run_name == "magrpo-python-api" and run.info.status == "FINISHED"
    assert tags["lineage.checkpoint.final"].startswith(f"checkpoint/{out['run_key']}@")


# --- slow: the flow beside the API, concurrency, the CLI --------------------------------------------


@pytest.mark.slow
def test_the_api_and_the_flow_run_one_driver(tiny_model_dir, tmp_path, monkeypatch, prefect_harness, pinned_threads):
    """The same config through `trainer.train()` and `train_magrpo(config=...)`: the same run key, artifact keys
    and weights, the same lineage tags in MLflow, and both take the run-key lock; `train(as_flow=True)` is the
    flow on the trainer's own store."""
    from coopflow.flows.train import train_magrpo

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # (the flow sets its torch threads; the API leaves the process's)
    locks = []
    real_lock = ArtifactStore.lock
    monkeypatch.setattr(ArtifactStore, "lock", lambda self, name, keys=None: locks.append(name) or
                        real_lock(self, name, keys))
    tr = _trainer(str(tiny_model_dir), tmp_path / "api")
    a = tr.train(show_progress=False)
    cfg = tr.run_config().model_dump(mode="json")
    cfg["data_dir"] = str(tmp_path / "flow")
    b = train_magrpo(config=cfg)
    assert a["run_key"] == b["run_key"] and locks == [f"run-{a['run_key']}"] * 2
    assert Path(a["checkpoint"]).name == Path(b["checkpoint"]).name
    assert _weights(Path(a["checkpoint"])) == _weights(Path(b["checkpoint"]))
    api, flow = (set(ArtifactStore.at(tmp_path / d).artifacts()) for d in ("api", "flow"))
    assert {x for x in api if x[0] not in ("dataset", "model")} == {x for x in flow if x[0] not in ("dataset", "model")}
    assert a["eval"] == b["eval"] and a["env_steps"] == b["env_steps"]
    (ra,), (rb,) = _mlflow_runs(tmp_path / "api"), _mlflow_runs(tmp_path / "flow")
    lineage = [{k: v for k, v in r.data.tags.items() if k.startswith(("lineage.", "coopflow.run_key"))} for r in (ra, rb)]
    assert lineage[0] == lineage[1] and len(lineage[0]) >= 4, lineage
    assert ra.data.tags["coopflow.entry"] == "python-api" and "prefect.flow_run_id" in rb.data.tags
    assert ra.data.params == rb.data.params | {"data_dir": ra.data.params["data_dir"]}
    c = tr.train(as_flow=True, show_progress=False)  # the trainer's own config as the flow: all of it stored
    assert c["run_key"] == a["run_key"] and c["executed"] == {} and locks[-1] == f"run-{a['run_key']}"
    rc = next(r for r in _mlflow_runs(tmp_path / "api") if r.info.run_id == c["mlflow_run_id"])
    assert "prefect.flow_run_id" in rc.data.tags and rc.data.tags["coopflow.run_key"] == a["run_key"]


SLOW_REWARD = '''
import time
from coopflow.stages.score.rewards import length_ratio


def slow_length_ratio(c1, c2):
    """length_ratio after 5 s: keeps the first run busy while the second starts."""
    time.sleep(5)
    return length_ratio(c1, c2)
'''

API_CHILD = '''
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from slow_reward import slow_length_ratio
from tests.test_one_driver import _trainer
out = _trainer(sys.argv[1], Path(sys.argv[2]), slow_length_ratio).train(show_progress=False)
print("SUMMARY " + json.dumps({k: out[k] for k in ("run_key", "executed", "mlflow_run_id", "checkpoint")}))
'''


def _api_child(model: Path, data: Path, lib: Path, log: Path) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI", "COOPFLOW_HOME")}
    with open(log, "a") as f:
        return subprocess.Popen([sys.executable, "-c", API_CHILD, str(model), str(data), str(lib)], cwd=REPO,
                                stdout=f, stderr=f, env={**clean, "OMP_NUM_THREADS": "1"})


def _holds_a_run_lock(data: Path) -> bool:
    if not (data / "artifacts" / ".locks").is_dir():
        return False
    return any(lk["name"].startswith("run-") for lk in ArtifactStore.at(data).held_locks())


def _child_summary(log: Path) -> dict:
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("SUMMARY ")]
    assert lines, log.read_text()[-3000:]
    return json.loads(lines[-1].removeprefix("SUMMARY "))


@pytest.mark.slow
def test_two_api_runs_of_one_key_at_once_train_once(tiny_model_dir, tmp_path):
    """The second `trainer.train()` starts while the first holds the run-key lock: it waits, then reuses what the
    first stored and its MLflow run (one run, FINISHED), as two `coopflow run`s of one key do."""
    lib, data = tmp_path / "lib", tmp_path / "data"
    lib.mkdir()
    (lib / "slow_reward.py").write_text(SLOW_REWARD)
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = _api_child(tiny_model_dir, data, lib, a_log)
    t0 = time.time()
    while not _holds_a_run_lock(data):
        assert a.poll() is None and time.time() - t0 < 300, a_log.read_text()[-3000:]
        time.sleep(0.2)
    b = _api_child(tiny_model_dir, data, lib, b_log)
    for proc, log in ((a, a_log), (b, b_log)):
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    first, second = _child_summary(a_log), _child_summary(b_log)
    assert first["run_key"] == second["run_key"] and first["checkpoint"] == second["checkpoint"]
    assert first["executed"].get("update") and second["executed"] == {}  # one trained, the other reused it
    runs = _mlflow_runs(data)
    assert [(r.info.run_id, r.info.status) for r in runs] == [(first["mlflow_run_id"], "FINISHED")]
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    assert ArtifactStore.at(data).verify_all()[1] == []


@pytest.mark.slow
def test_the_cli_publishes_to_a_file_mirror_that_does_not_exist_yet(tmp_path):
    """`COOPFLOW_REMOTE_STORE=file:///...` (a shared mount's folder, not made yet): `coopflow run` publishes every
    artifact (it failed 'could not publish ... No such file or directory')."""
    from tests.test_faults import _cli, _config, _summary

    url = (tmp_path / "share" / "coopflow").as_uri()
    data, log = tmp_path / "data", tmp_path / "cli.log"
    assert _cli("train-magrpo", _config(data, "magrpo"), data, log, COOPFLOW_REMOTE_STORE=url).wait(900) == 0, \
        log.read_text()[-3000:]
    published = _mirror_keys(url)
    assert ("checkpoint", _summary(log, "run_key")) in published
    assert set(ArtifactStore.at(data).artifacts()) <= published
