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


def test_deployment_run_completes(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": url,
           "COOPFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING"}
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
        # the actor-critic deployments, with a critic section in the parameters
        for algo, critic_file in (("iac", "agent_0/critic/value_head.pt"), ("maac", "critic/value_head.pt")):
            data = tmp_path / f"data-{algo}"
            cfg = small_config(data, critic={"critic_model": "tiny"})
            cfg["trainer"] = {"num_train_epochs": 1, "num_turns": 1, "max_new_tokens": 8, "rollout_buffer_size": 2,
                              "eval_interval": 0, "eval_num_samples": 2}
            run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", f"train-{algo}/local",
                                  "--params", json.dumps({"config": cfg}), "--watch", "--watch-timeout", "400"],
                                 env=env, capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            ckpts = [p for p in (data / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
            assert len(ckpts) == 1 and (ckpts[0] / critic_file).is_file()
        for algo in ("madpo", "marlhf"):  # the preference deployments
            data = tmp_path / f"data-{algo}"
            cfg = small_config(data)
            cfg["trainer"] = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "preference_pairs_per_sample": 2, "train_batch_size": 2, "eval_interval": 0,
                              "eval_num_samples": 2, "temperature": 1.0}
            if algo == "marlhf":
                cfg["trainer"].update(num_generations=2, rollout_buffer_size=2)
            run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", f"train-{algo}/local",
                                  "--params", json.dumps({"config": cfg}), "--watch", "--watch-timeout", "400"],
                                 env=env, capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            assert any((data / "artifacts" / "pairs").iterdir())
        # the iterative deployments take max_new_rounds=1 by default: each run adds exactly one round
        for algo in ("madpo-iter", "marlhf-iter"):
            data = tmp_path / f"data-{algo}"
            cfg = small_config(data)
            cfg["trainer"] = {"num_iterations": 3, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "num_train_epochs": 1, "eval_num_samples": 2, "temperature": 1.0,
                              "reward_num_train_epochs": 1, "num_generations": 2, "rollout_buffer_size": 2}
            if algo == "madpo-iter":
                for k in ("reward_num_train_epochs", "num_generations", "rollout_buffer_size"):
                    del cfg["trainer"][k]
            for expected in (1, 2):
                run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", f"train-{algo}/local",
                                      "--params", json.dumps({"config": cfg}), "--watch", "--watch-timeout", "400"],
                                     env=env, capture_output=True, text=True, timeout=600)
                assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
                assert _completed_rounds(cfg, algo) == expected
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
