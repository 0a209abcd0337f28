"""The repository's prefect.yaml: its deployments agree with the configs they run, and `prefect deploy --all`
registers them on a work pool whose worker runs one to completion."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def _declared() -> list[dict]:
    return yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]


def test_each_declared_deployment_runs_its_config_with_the_flow_that_config_names():
    from coopflow.flows.serve import ITERATIVE, from_config
    from coopflow.flows.train import FLOWS

    by_fn = {f.fn.__name__: name for name, f in FLOWS.items()}
    seen = set()
    for d in _declared():
        path, fn = d["entrypoint"].split(":")
        assert path == "flows/train.py" and fn in by_fn, d["entrypoint"]
        flow = by_fn[fn]
        served = from_config(REPO / d["parameters"]["config_path"], preflight=False)
        assert served.flow == flow, (d["name"], served.flow, flow)  # the config is for this flow
        assert ("max_new_rounds" in d["parameters"]) == (flow in ITERATIVE)
        if flow in ITERATIVE:
            assert d["parameters"]["max_new_rounds"] == 1  # a scheduled run adds one round
        assert d["work_pool"]["name"] == "coopflow"
        for s in d.get("schedules", []):
            from prefect.client.schemas.schedules import CronSchedule

            CronSchedule(cron=s["cron"])
        seen.add(f"{flow}/{d['name']}")
    assert {"train-magrpo/story", "train-madpo-iter/nightly"} <= seen and len(seen) == len(_declared())


@pytest.mark.slow
def test_prefect_deploy_all_registers_them_and_a_worker_runs_one(tmp_path, prefect_harness):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from tests.conftest import small_config

    url = PREFECT_API_URL.value()
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "prefect"),
           "COOPFLOW_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="coopflow", type="process"))
    r = subprocess.run([sys.executable, "-m", "prefect", "deploy", "--all", "--no-prompt"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        deps = {f"{flows[d.flow_id]}/{d.name}": d for d in client.read_deployments() if d.work_pool_name == "coopflow"}
    assert len(deps) == len(_declared())
    nightly = deps["train-madpo-iter/nightly"]
    assert nightly.parameters == {"config_path": "configs/madpo-iter-story.yaml", "max_new_rounds": 1}
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert nightly.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert not deps["train-magrpo/story"].schedules

    # a run of train-magrpo/story (its config, made small by the run's overrides), picked up by one worker
    small = small_config(tmp_path / "data")
    overrides = {"data_dir": small["data_dir"], "taskset.num_items": 4, "taskset.num_eval_items": 2,
                 "trainer.num_train_epochs": 1, "trainer.num_generations": 2, "trainer.max_new_tokens": 8,
                 "trainer.eval_num_samples": 2}
    run = run_deployment("train-magrpo/story", parameters={"overrides": overrides}, timeout=0)
    w = subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", "coopflow", "--run-once"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state.is_completed(), f"{state.type.value} {state.message}\n{w.stdout[-3000:]}{w.stderr[-3000:]}"
    ckpts = [p for p in (tmp_path / "data" / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
    assert len(ckpts) == 1 and (ckpts[0] / "agent_0" / "config.json").is_file()
