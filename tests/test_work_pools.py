"""Scale-out over a Prefect work pool (issue 21): a real Prefect server on loopback, a `process` work pool, two
workers (separate processes), `coopflow deploy`; a seed sweep of 4 train-magrpo runs and two train-madpo-iter
rounds spread over both workers, all writing one artifact store and one MLflow store on shared storage."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from tests.conftest import small_config
from tests.test_deployment import _wait

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.read().strip() == b"true"
    except OSError:
        return False


def test_two_workers_run_a_seed_sweep_and_rounds_into_one_shared_store(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/api"
    shared = tmp_path / "shared"  # the "shared storage" every worker sees: artifacts + MLflow under one dir
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=url, COOPFLOW_HOME=str(shared),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="INFO", OMP_NUM_THREADS="1",
               PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="2")
    procs, logs = [], []

    def start(args: list[str], log: str) -> subprocess.Popen:
        out = open(tmp_path / log, "w")
        logs.append(out)
        p = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=out, stderr=out, start_new_session=True)
        procs.append(p)
        return p

    port = url.split(":")[2].split("/")[0]
    start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", port, "--no-ui"],
          "server.log")
    try:
        _wait(lambda: _healthy(url), 180, "the Prefect server")
        r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "deploy", "--pool", "wp", "--name", "pool"], env=env,
                           cwd=REPO, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert {"train-magrpo/pool", "train-madpo-iter/pool"} <= set(r.stdout.split())
        for i in range(2):  # one run at a time each: the sweep must use both
            start([sys.executable, "-m", "prefect", "worker", "start", "--pool", "wp", "--name", f"worker-{i}",
                   "--limit", "1"], f"worker-{i}.log")

        # this process's Prefect client talks to that server (a settings context: it wins over a test harness
        # another test of this worker process may have entered)
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL, temporary_settings

        ctx = temporary_settings(updates={PREFECT_API_URL: url})
        ctx.__enter__()
        procs.append(ctx)  # left in `finally`

        def state(rid):
            with get_client(sync_client=True) as client:
                return client.read_flow_run(rid).state

        def finish(rids: list, timeout: float) -> None:
            _wait(lambda: all(state(rid).is_final() for rid in rids), timeout, "the work-pool runs")
            for rid in rids:
                st = state(rid)
                assert st.type.value == "COMPLETED", (st.type.value, st.message,
                                                      [(tmp_path / f"worker-{i}.log").read_text()[-2000:]
                                                       for i in range(2)])

        sweep = [run_deployment("train-magrpo/pool", parameters={"config": small_config(shared),
                                                                 "overrides": {"seed": s}}, timeout=0).id
                 for s in range(4)]
        it_cfg = small_config(shared)
        it_cfg["trainer"] = {"num_iterations": 2, "max_new_tokens": 8, "preference_num_candidates": 4,
                             "num_train_epochs": 1, "eval_num_samples": 2, "temperature": 1.0}
        rounds = [run_deployment("train-madpo-iter/pool", parameters={"config": it_cfg}, timeout=0).id]
        finish(sweep + rounds, 900)
        rounds.append(run_deployment("train-madpo-iter/pool", parameters={"config": it_cfg}, timeout=0).id)
        finish(rounds, 600)  # the deployments' max_new_rounds=1: each scheduled/triggered run adds one round

        ran = [(tmp_path / f"worker-{i}.log").read_text().count("submitted to infrastructure")
               for i in range(2)]
        assert sum(ran) == 6 and all(n >= 1 for n in ran), ran  # both workers took runs
        checked, bad = ArtifactStore(shared / "artifacts").verify_all()
        assert checked > 20 and bad == [], bad
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{shared / 'mlflow.db'}")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        names = sorted(r.info.run_name for r in runs)
        assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
        assert len([n for n in names if n.startswith("magrpo-")]) == 4  # four seeds, four runs
        assert names.count("round-1") == 1 and names.count("round-2") == 1, names  # each round recorded once
        assert len([n for n in names if n.startswith("madpo-iter-")]) == 1, names  # one parent run
    finally:
        for p in reversed(procs):
            if not isinstance(p, subprocess.Popen):
                p.__exit__(None, None, None)
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
        for out in logs:
            out.close()
