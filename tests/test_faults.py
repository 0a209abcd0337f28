"""Kill -9 anywhere (issue 20): a run SIGKILLed at a chosen point (COOPFLOW_FAULT, artifacts/faults.py) leaves no
partial artifact; the rerun completes and ends with the same run_key and byte-identical weights as a run that was
never interrupted; worker processes do not outlive their killed parent."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from tests.conftest import small_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys
from coopflow.artifacts import ArtifactStore
from tests.helpers import run_stages as _run
from coopflow.schemas.config import validate_config
cfg = validate_config(json.loads(sys.argv[1]))
_run(cfg, ArtifactStore(cfg.resolved_data_dir() / "artifacts"), False)
"""


def _config(root: Path, algorithm: str) -> dict:
    base = small_config(root)
    t = {**base["trainer"], "num_generations": 2, "rollout_buffer_size": 1}
    if algorithm == "magrpo-mp":
        return {**base, "algorithm": "magrpo",
                "trainer": {**t, "parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}}
    if algorithm == "magrpo-behind":
        return {**base, "algorithm": "magrpo", "checkpoint_every": 2, "checkpoint_write": "background", "trainer": t}
    if algorithm == "iac":
        return {**base, "algorithm": "iac", "critic": {"critic_model": "tiny"},
                "trainer": {**t, "num_generations": 1, "num_turns": 1}}
    if algorithm in ("madpo", "madpo-iter"):
        pref = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4, "train_batch_size": 4,
                "eval_num_samples": 2, "temperature": 1.0, "agent_learning_rate": 1e-3}
        if algorithm == "madpo-iter":
            pref["num_iterations"] = 2
        return {**base, "algorithm": algorithm, "trainer": pref}
    return {**base, "algorithm": "magrpo", "checkpoint_every": 2, "trainer": t}


def _weights(ckpt: Path) -> dict[str, str]:
    return {str(p.relative_to(ckpt)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(ckpt.rglob("*.safetensors"))}


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _killed_leaving_nothing(proc, point: str, watch, what: str, log: Path | None = None) -> None:
    """Wait for `proc` to die of SIGKILL at `point`; every process `watch(pid)` saw meanwhile must end within 30 s."""
    seen: set[int] = set()
    while proc.poll() is None:  # note the processes (mp workers, the Prefect server, ...) while it runs
        seen |= set(watch(proc.pid))
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL, \
        f"not killed at {point} (exit {proc.returncode})" + (f":\n{log.read_text()[-3000:]}" if log else "")
    deadline = time.time() + 30
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in seen):
        time.sleep(0.2)
    assert not [p for p in seen if Path(f"/proc/{p}").exists()], what


@pytest.mark.parametrize("algorithm, point", [
    ("magrpo", "commit:checkpoint"),   # during a checkpoint write (complete, not yet renamed into place)
    ("magrpo-behind", "checkpoint-write"),  # while a checkpoint is written beside the next segment (writer thread)
    ("magrpo", "generate@3"),          # mid-generation, after two updates
    ("magrpo", "update@3"),            # mid-update, between an update and its bookkeeping
    ("magrpo-mp", "update@2"),         # the parent of the agents' worker processes
    ("iac", "commit:ac_samples@2"),    # an actor-critic run while writing its samples
    ("madpo", "commit:pairs"),         # while writing the preference pairs
    ("madpo-iter", "commit:pairs@2"),  # while writing round 2's replay shard
])
def test_kill_9_then_rerun_equals_an_uninterrupted_run(tmp_path, algorithm, point, pinned_threads):
    """(One torch thread here as in the killed child: the resumed and the clean run reduce floats in its order.)"""
    from tests.helpers import run_stages as _run

    data = _config(tmp_path / "killed", algorithm)
    env = {**os.environ, "COOPFLOW_FAULT": point, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(data)], cwd=REPO, env=env)
    _killed_leaving_nothing(proc, point, _children, "worker processes outlived their parent")
    store = ArtifactStore(tmp_path / "killed" / "artifacts")
    assert store.verify_all()[1] == []  # nothing half-written is visible as an artifact
    cfg = validate_config(data)
    resumed = _run(cfg, store, False)
    clean_cfg = validate_config({**data, "data_dir": str(tmp_path / "clean")})
    clean = _run(clean_cfg, ArtifactStore(tmp_path / "clean" / "artifacts"), False)
    assert Path(resumed["checkpoint"]).name == Path(clean["checkpoint"]).name  # the same run_key
    assert _weights(Path(resumed["checkpoint"])) == _weights(Path(clean["checkpoint"]))  # byte-identical


def _servers_of(prefect_home: Path) -> list[int]:
    """Live uvicorn (Prefect server) processes started with this PREFECT_HOME."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"uvicorn" in (proc / "cmdline").read_bytes() and \
                    f"PREFECT_HOME={prefect_home}".encode() in (proc / "environ").read_bytes():
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def test_a_killed_cli_run_leaves_no_prefect_server_behind(tmp_path):
    """`coopflow run` SIGKILLed mid-training: the ephemeral Prefect server it started stops too."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(OMP_NUM_THREADS="1", PREFECT_HOME=str(tmp_path / "prefect"), COOPFLOW_FAULT="update@2")
    with open(tmp_path / "out.log", "w") as log:  # files, not pipes: nothing may keep a pipe open after the kill
        r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config",
                            "configs/magrpo-story.yaml", "--set", f"data_dir={tmp_path / 'data'}"],
                           cwd=REPO, env=env, stdout=log, stderr=log, timeout=600)
    assert r.returncode == -signal.SIGKILL, (tmp_path / "out.log").read_text()[-2000:]
    deadline = time.time() + 20
    while time.time() < deadline and _servers_of(tmp_path / "prefect"):
        time.sleep(0.5)
    assert not _servers_of(tmp_path / "prefect"), "the ephemeral Prefect server outlived the killed CLI"


# --- the same through `coopflow run` (Prefect flows, MLflow tracking, the CLI's own processes) ----------------

def _cli(flow: str, config: dict, data: Path, log: Path, **env: str) -> subprocess.CompletedProcess:
    """`coopflow run FLOW` on `config` with its data under `data` (output appended to `log`: files, not pipes)."""
    cfg_file = log.with_name(f"{log.stem}-config.yaml")
    cfg_file.write_text(json.dumps(config))  # (JSON is YAML)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI", "COOPFLOW_HOME", "COOPFLOW_FAULT")}
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "run", flow, "--config", str(cfg_file),
                                 "--set", f"data_dir={data}"], cwd=REPO, stdout=out, stderr=out,
                                env={**clean, "OMP_NUM_THREADS": "1", **env})


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        kids = set(_children(todo.pop())) - out
        out |= kids
        todo += kids
    return out


def _summary(log: Path, field: str) -> str:
    lines = [ln.split(":", 1)[1].strip() for ln in log.read_text().splitlines() if ln.strip().startswith(f"{field}:")]
    assert lines, f"no {field} in the output:\n{log.read_text()[-3000:]}"
    return lines[-1]


@pytest.mark.parametrize("flow, algorithm, point", [
    ("train-magrpo", "magrpo", "prepare@2"),            # while the agents' models are being prepared
    ("train-magrpo", "magrpo", "mlflow-log@3"),         # during MLflow logging
    ("train-magrpo", "magrpo-mp", "generate@2"),        # mid-generation, with a worker process per agent
    ("train-madpo-iter", "madpo-iter", "commit:pairs@2"),  # while writing round 2's replay shard
])
def test_kill_9_of_coopflow_run_then_rerun_equals_an_uninterrupted_run(tmp_path, flow, algorithm, point):
    """SIGKILL of the whole CLI (its flow, MLflow run and workers in one process tree): no process of the tree
    survives, nothing partial is visible, the rerun finishes one MLflow run with the uninterrupted run's weights."""
    import mlflow
    from tests.helpers import run_stages as _run

    data = _config(tmp_path / "killed", algorithm)
    log = tmp_path / "cli.log"
    proc = _cli(flow, data, tmp_path / "killed", log, COOPFLOW_FAULT=point)
    _killed_leaving_nothing(proc, point, _descendants, "processes outlived the killed `coopflow run`", log)
    store = ArtifactStore(tmp_path / "killed" / "artifacts")
    assert store.verify_all()[1] == []
    assert _cli(flow, data, tmp_path / "killed", log).wait(timeout=900) == 0, log.read_text()[-3000:]

    clean = _run(validate_config({**data, "data_dir": str(tmp_path / "clean")}),
                 ArtifactStore(tmp_path / "clean" / "artifacts"), False)
    resumed = Path(_summary(log, "checkpoint"))
    assert resumed.name == Path(clean["checkpoint"]).name  # the same run_key
    assert _weights(resumed) == _weights(Path(clean["checkpoint"]))  # byte-identical
    runs = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'killed' / 'mlflow.db'}").search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(f"sqlite:///{tmp_path / 'killed' / 'mlflow.db'}")
         .search_experiments()])
    assert [r.info.status for r in runs if r.info.status != "KILLED"].count("FINISHED") >= 1
    assert not [r for r in runs if r.info.status == "RUNNING"], "an MLflow run was left RUNNING"


@pytest.mark.slow
def test_a_prefect_server_that_goes_away_ends_the_run_in_one_line_and_the_rerun_continues(tmp_path, pinned_threads):
    """PREFECT_API_URL's server killed under a `coopflow run`: the run ends within the grace time plus a poll with
    one line naming the server, what it stored and the command that continues (it used to print ~80 s of
    connection errors, then a traceback); rerun against a live server, it reaches the uninterrupted run's weights."""
    import shlex
    import socket

    import yaml

    from tests.helpers import run_stages as _run

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    data = _config(tmp_path / "run", "magrpo")
    data["trainer"] = {**data["trainer"], "num_train_epochs": 3}
    data["reward"] = {"name": "tests.helpers:paced_length_ratio"}
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=url, COOPFLOW_SERVER_GRACE_S="5",
               OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")

    def server():
        p = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                              str(port), "--no-ui"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        from coopflow.flows.reaper import healthy

        t0 = time.time()
        while not healthy(url):
            assert time.time() - t0 < 240 and p.poll() is None, "the test's Prefect server did not start"
            time.sleep(1)
        return p

    command = [sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config", str(cfg_file),
               "--no-progress"]
    srv = server()
    try:
        run = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ckpts = tmp_path / "run" / "artifacts" / "checkpoint"
        t0 = time.time()
        while not (ckpts.is_dir() and any(ckpts.iterdir())):  # a first segment stored, more to train
            assert time.time() - t0 < 300 and run.poll() is None, run.stderr.read()[-3000:] if run.poll() else ""
            time.sleep(0.2)
        os.killpg(srv.pid, signal.SIGKILL)
        killed = time.time()
        _, err = run.communicate(timeout=240)
        assert run.returncode == 3, err[-3000:]
        assert time.time() - killed < 60  # 5 s of grace, a 2 s poll, and Prefect's own retries do not matter
        last = err.strip().splitlines()[-1]
        assert f"the Prefect server at {url} stopped answering" in last and "checkpoint" in last, last
        assert f"rerun `coopflow run train-magrpo --config {shlex.quote(str(cfg_file))}" in last, last
        srv = server()
        again = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        resumed = next(ln.split(":", 1)[1].strip() for ln in again.stdout.splitlines()
                       if ln.strip().startswith("checkpoint:"))
    finally:
        try:
            os.killpg(srv.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    clean = _run(validate_config({**data, "data_dir": str(tmp_path / "clean")}),
                 ArtifactStore(tmp_path / "clean" / "artifacts"), False)
    assert Path(resumed).name == Path(clean["checkpoint"]).name
    assert _weights(Path(resumed)) == _weights(Path(clean["checkpoint"]))
