"""The seed's tutorials as scripts (examples/): each runs end to end on the tiny model (quick mode).

They run in this process (as `python examples/X.py` would: `__name__ == "__main__"`, the working
directory and environment set as a user's), which saves a fresh interpreter's imports per script;
the one that continues a run as a Prefect flow uses the session's test server."""

import runpy
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
    ("centralized_magrpo.py", "one joint actor (1 model, 2 roles): env steps 16"),
])
def test_example_runs(script, expect, tmp_path, monkeypatch, capsys, prefect_harness):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COOPFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COOPFLOW_EXAMPLE_QUICK", "1")
    monkeypatch.setenv("COOPFLOW_EXAMPLE_OUT", str(tmp_path / "out"))
    monkeypatch.setattr("sys.argv", [str(REPO / "examples" / script)])
    runpy.run_path(str(REPO / "examples" / script), run_name="__main__")
    out = capsys.readouterr().out
    assert expect in out, out[-2000:]
    assert not (tmp_path / "mlruns").exists()  # MLflow artifacts stay under the data dir
    if script == "centralized_magrpo.py":  # the checkpoint holds the one joint actor
        assert (tmp_path / "out" / "agent_0" / "config.json").is_file()
        assert not (tmp_path / "out" / "agent_1").exists()
    if script == "story_length_ratio.py":
        assert (tmp_path / "out" / "agent_1" / "config.json").is_file()
