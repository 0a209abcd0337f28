"""Deployment smoke: `coopflow serve` + `prefect deployment run 'train-magrpo/local' --watch` completes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli import _healthy
from tests.conftest import small_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str) -> None:
    t0 = time.time()
    while not pred():
        if time.time() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1)


def _completed_rounds(cfg: dict, algorithm: str) -> int:
    from schemas.config import validate_config
    from stages import train_iterative as I
    from stages import train_online as T
    from stages.build_taskset import build_taskset

    c = validate_config(cfg, algorithm)
    store = T.ArtifactStore(Path(cfg["data_dir"]) / "artifacts")
    return I.completed_rounds(T.make_context(c, store, build_taskset(c.taskset, store)))


_TRIGGER = """
import json, sys, time
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
ids = {run_deployment(name=n, parameters=p, timeout=0).id: n for n, p in json.loads(sys.argv[1])}
t0, done = time.time(), {}
with get_client(sync_client=True) as client:
    while len(done) < len(ids) and time.time() - t0 < 500:
        for i, n in ids.items():
            st = client.read_flow_run(i).state
            if i not in done and st is not None and st.is_final():
                done[i] = (n, st.type.value, st.message)
        time.sleep(1)
print(json.dumps([done.get(i, (n, "TIMEOUT", "")) for i, n in ids.items()]))
"""


def _run_deployments(env: dict, runs: list[tuple[str, dict]]) -> None:
    """Trigger deployment runs at once through Prefect's client and wait until each one completes."""
    p = subprocess.run([sys.executable, "-c", _TRIGGER, json.dumps(runs)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    states = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(s == "COMPLETED" for _, s, _ in states), states


def _one_checkpoint_with(data: Path, file: str) -> bool:
    ckpts = [p for p in (data / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
    return len(ckpts) == 1 and (ckpts[0] / file).is_file()


def test_deployment_run_completes(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": url,
           "COOPFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
           "PREFECT_RUNNER_PROCESS_LIMIT": "8"}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                       "--port", str(port), "--no-ui"], env=env, cwd=tmp_path,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        _wait(lambda: _healthy(url), 240, "the Prefect server")
        procs.append(subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--name", "local"], env=env,
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        _wait(lambda: subprocess.run([sys.executable, "-m", "prefect", "deployment", "inspect", "train-magrpo/local"],
                                     env=env, capture_output=True).returncode == 0, 240, "the served deployment")
        params = {"config": small_config(tmp_path / "data"), "overrides": {"seed": 3}}
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "train-magrpo/local",
                              "--params", json.dumps(params), "--watch", "--watch-timeout", "400"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        ckpts = [p for p in (tmp_path / "data" / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
        assert len(ckpts) == 1 and (ckpts[0] / "agent_0" / "config.json").is_file()
        # Every other deployment, triggered together (the served runner executes them concurrently).
        runs, checks = [], []
        for algo, critic_file in (("iac", "agent_0/critic/value_head.pt"), ("maac", "critic/value_head.pt")):
            data = tmp_path / f"data-{algo}"  # the actor-critic deployments, with a critic section
            cfg = small_config(data, critic={"critic_model": "tiny"})
            cfg["trainer"] = {"num_train_epochs": 1, "num_turns": 1, "max_new_tokens": 8, "rollout_buffer_size": 2,
                              "eval_interval": 0, "eval_num_samples": 2}
            runs.append((f"train-{algo}/local", {"config": cfg}))
            checks.append(lambda data=data, f=critic_file: _one_checkpoint_with(data, f))
        for algo in ("madpo", "marlhf"):  # the preference deployments
            data = tmp_path / f"data-{algo}"
            cfg = small_config(data)
            cfg["trainer"] = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "preference_pairs_per_sample": 2, "train_batch_size": 2, "eval_interval": 0,
                              "eval_num_samples": 2, "temperature": 1.0}
            if algo == "marlhf":
                cfg["trainer"].update(num_generations=2, rollout_buffer_size=2)
            runs.append((f"train-{algo}/local", {"config": cfg}))
            checks.append(lambda data=data: any((data / "artifacts" / "pairs").iterdir()))
        # the iterative deployments take max_new_rounds=1 by default: each run adds exactly one round
        iterative = []
        for algo in ("madpo-iter", "marlhf-iter"):
            cfg = small_config(tmp_path / f"data-{algo}")
            cfg["trainer"] = {"num_iterations": 3, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "num_train_epochs": 1, "eval_num_samples": 2, "temperature": 1.0,
                              "reward_num_train_epochs": 1, "num_generations": 2, "rollout_buffer_size": 2}
            if algo == "madpo-iter":
                for k in ("reward_num_train_epochs", "num_generations", "rollout_buffer_size"):
                    del cfg["trainer"][k]
            iterative.append((algo, cfg))
        for expected in (1, 2):
            batch = [(f"train-{algo}/local", {"config": cfg}) for algo, cfg in iterative]
            _run_deployments(env, (runs if expected == 1 else []) + batch)
            for algo, cfg in iterative:
                assert _completed_rounds(cfg, algo) == expected, algo
        assert all(check() for check in checks)
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
