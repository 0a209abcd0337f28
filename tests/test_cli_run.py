"""The README's `coopflow run ... --set ...` path end to end (ephemeral Prefect server), and its errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path, *extra):
    env = {**os.environ, "COOPFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config",
                           "configs/magrpo-story.yaml", "--no-progress", *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_cli_run_with_overrides_writes_summary(tmp_path):
    out = tmp_path / "summary.json"
    r = _run(tmp_path, "--set", "taskset.num_items=2", "--set", "trainer.num_train_epochs=1",
             "--set", "trainer.max_new_tokens=8", "--set", "trainer.eval_num_samples=2", "--summary-json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads(out.read_text())
    assert s["env_steps"] == 2 * 4 and s["executed"]["generate"] == 2
    assert {"reward_first", "reward_last", "train_seconds", "env_steps_per_s", "eval", "mlflow_run_id",
            "checkpoint"} <= set(s)
    assert (Path(s["checkpoint"]) / "agent_0" / "model.safetensors").is_file()
    assert str(tmp_path / "home") in s["checkpoint"]  # COOPFLOW_HOME is the data dir
    assert "coopflow run summary" in r.stdout


def test_cli_run_missing_model_dir_is_a_clear_error(tmp_path):
    r = _run(tmp_path, "--set", "agents.agent_model=/nonexistent/model")
    assert r.returncode == 2
    assert "agents.agent_model: model directory '/nonexistent/model' does not exist" in r.stderr
    assert not (tmp_path / "home").exists()  # refused before the data dir, Prefect or MLflow were touched
