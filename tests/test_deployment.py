"""Deployment smoke: `coopflow serve` + `prefect deployment run 'train-magrpo/local' --watch` completes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import small_config

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _wait(pred, timeout: float, what: str) -> None:
    t0 = time.time()
    while not pred():
        if time.time() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1)


def _completed_rounds(cfg: dict, algorithm: str) -> int:
    from coopflow.schemas.config import validate_config
    from coopflow.stages.loops import rounds as I
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.tasks.taskset import build_taskset

    c = validate_config(cfg, algorithm)
    store = ArtifactStore(Path(cfg["data_dir"]) / "artifacts")
    return I.completed_rounds(make_context(c, store, build_taskset(c.taskset, store)))


def _trigger(name: str, params: dict):
    """Create a deployment run (the served runner picks it up) and return its id."""
    from prefect.deployments import run_deployment

    return run_deployment(name=name, parameters=params, timeout=0).id


def _state(run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def _one_checkpoint_with(data: Path, file: str) -> bool:
    ckpts = [p for p in (data / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
    return len(ckpts) == 1 and (ckpts[0] / file).is_file()


def test_deployment_run_completes(tmp_path, prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()  # the session's Prefect test server (a server of its own costs ~30 s to boot)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": url,
           "COOPFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_RUNNER_PROCESS_LIMIT": "8",
           "OMP_NUM_THREADS": "1"}  # 8 runs at once on a small machine: one torch thread each (see README)
    env.pop("MLFLOW_TRACKING_URI", None)

    from coopflow.flows.train import FLOWS

    names = {f"{f}/local" for f in FLOWS}

    def served() -> bool:
        with get_client(sync_client=True) as client:
            flow_names = {f.id: f.name for f in client.read_flows()}
            have = {f"{flow_names.get(d.flow_id)}/{d.name}" for d in client.read_deployments()}
        return names <= have

    log = tmp_path / "serve.log"  # what the served runner printed: shown when a run fails, so a failure says why
    serve = subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "serve", "--name", "local"], env=env, cwd=REPO,
                             stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def why() -> str:
        return "\n--- serve log (tail) ---\n" + log.read_text(errors="replace")[-6000:]

    try:
        # While the server process starts: round 1 of each iterative experiment, run here in-process. Its
        # deployment run below must then add exactly one round (the 2nd), resuming from the store.
        iterative = {}
        for algo in ("madpo-iter", "marlhf-iter"):
            cfg = small_config(tmp_path / f"data-{algo}")
            cfg["trainer"] = {"num_iterations": 3, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "num_train_epochs": 1, "eval_num_samples": 2, "temperature": 1.0,
                              "reward_num_train_epochs": 1, "num_generations": 2, "rollout_buffer_size": 2}
            if algo == "madpo-iter":
                for k in ("reward_num_train_epochs", "num_generations", "rollout_buffer_size"):
                    del cfg["trainer"][k]
            FLOWS[f"train-{algo}"](config=cfg, max_new_rounds=1)
            assert _completed_rounds(cfg, algo) == 1, algo
            iterative[algo] = cfg
        _wait(served, 240, "the served deployments")
        # Every other deployment, triggered together through Prefect's client (the served runner executes
        # them concurrently, also while the CLI run below watches its own run).
        runs, checks = {}, []
        for algo, critic_file in (("iac", "agent_0/critic/value_head.pt"), ("maac", "critic/value_head.pt")):
            data = tmp_path / f"data-{algo}"  # the actor-critic deployments, with a critic section
            cfg = small_config(data, critic={"critic_model": "tiny"})
            cfg["trainer"] = {"num_train_epochs": 1, "num_turns": 1, "max_new_tokens": 8, "rollout_buffer_size": 2,
                              "eval_interval": 0, "eval_num_samples": 2}
            runs[_trigger(f"train-{algo}/local", {"config": cfg})] = algo
            checks.append(lambda data=data, f=critic_file: _one_checkpoint_with(data, f))
        data = tmp_path / "data-centralized"  # centralized MAGRPO: one joint actor, agent_0 only in its checkpoint
        runs[_trigger("train-magrpo-centralized/local", {"config": small_config(data)})] = "magrpo-centralized"
        checks.append(lambda data=data: _one_checkpoint_with(data, "agent_0/config.json")
                      and not any((data / "artifacts" / "checkpoint").glob("*/agent_1")))
        for algo in ("madpo", "marlhf"):  # the preference deployments
            data = tmp_path / f"data-{algo}"
            cfg = small_config(data)
            cfg["trainer"] = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4,
                              "preference_pairs_per_sample": 2, "train_batch_size": 2, "eval_interval": 0,
                              "eval_num_samples": 2, "temperature": 1.0}
            if algo == "marlhf":
                cfg["trainer"].update(num_generations=2, rollout_buffer_size=2)
            runs[_trigger(f"train-{algo}/local", {"config": cfg})] = algo
            checks.append(lambda data=data: any((data / "artifacts" / "pairs").iterdir()))
        for algo, cfg in iterative.items():  # max_new_rounds=1 is the iterative deployments' default
            runs[_trigger(f"train-{algo}/local", {"config": cfg})] = algo

        # The path: `prefect deployment run ... --watch` completes.
        params = {"config": small_config(tmp_path / "data"), "overrides": {"seed": 3}}
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "train-magrpo/local",
                              "--params", json.dumps(params), "--watch", "--watch-timeout", "400"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + why()
        ckpts = [p for p in (tmp_path / "data" / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
        assert len(ckpts) == 1 and (ckpts[0] / "agent_0" / "config.json").is_file()

        _wait(lambda: all(_state(rid).is_final() for rid in runs), 500, "the batch of deployment runs")
        for rid, what in runs.items():
            st = _state(rid)
            assert st.type.value == "COMPLETED", f"{what}: {st.type.value} {st.message}{why()}"
        for algo, cfg in iterative.items():
            assert _completed_rounds(cfg, algo) == 2, algo
        assert all(check() for check in checks)
    finally:
        try:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(serve.pid, signal.SIGKILL)
