"""The seed's tutorials as scripts (examples/): each runs end to end on the tiny model (quick mode)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script,expect", [
    ("story_length_ratio.py", "eval {'eval/turn_1/reward_mean'"),
    ("multi_turn_feedback.py", "eval/turn_2/reward_mean"),
    ("resume_training.py", "in the same MLflow run"),
    ("heterogeneous_agents.py", "vocabularies: [384, 320]"),
    ("preference_learning.py", "MARLHF eval (task reward)"),
])
def test_example_runs(script, expect, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(COOPFLOW_HOME=str(tmp_path / "home"), COOPFLOW_EXAMPLE_QUICK="1",
               COOPFLOW_EXAMPLE_OUT=str(tmp_path / "out"), PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, str(REPO / "examples" / script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert expect in run.stdout
    if script == "story_length_ratio.py":
        assert (tmp_path / "out" / "agent_1" / "config.json").is_file()
