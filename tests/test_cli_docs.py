"""CLI error paths (no Prefect import needed) and the shipped configs (the configuration reference page is checked in
tests/test_docs.py)."""

import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "coopflow.flows.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_cli_rejects_invalid_value_naming_the_field():
    r = _cli("run", "train-magrpo", "--config", "configs/magrpo-story.yaml", "--set", "trainer.num_generations=1")
    assert r.returncode == 2
    assert "trainer.num_generations" in r.stderr and "greater than or equal to 2" in r.stderr
    assert "prefect" not in r.stderr.lower()  # failed before Prefect started


def test_cli_rejects_unknown_field_and_missing_file():
    r = _cli("validate", "--config", "configs/magrpo-story.yaml", "--set", "trainer.learning_rate=1")
    assert r.returncode == 2 and "trainer.learning_rate" in r.stderr
    r = _cli("validate", "--config", "no/such/file.yaml")
    assert r.returncode == 2 and "config file not found" in r.stderr


def test_missing_local_model_dirs_are_refused_naming_the_field(tmp_path):
    r = _cli("validate", "--config", "configs/magrpo-story.yaml", "--set", f"agents.agents=[tiny, {tmp_path}/gone]",
             "--set", "agents.agent_model=null")
    assert r.returncode == 2 and f"agents.agents: model directory '{tmp_path}/gone' does not exist" in r.stderr
    r = _cli("validate", "--config", "configs/iac-story.yaml", "--algorithm", "iac",
             "--set", "critic.critic_model=./no-critic-here")
    assert r.returncode == 2 and "critic.critic_model: model directory './no-critic-here'" in r.stderr
    r = _cli("validate", "--config", "configs/magrpo-story.yaml", "--set", "agents.agent_model=Qwen/Qwen2-0.5B")
    assert r.returncode == 0, r.stderr  # a hub id is not a local path: checked when it loads


def test_shipped_config_validates():
    r = _cli("validate", "--config", "configs/magrpo-story.yaml", "--algorithm", "magrpo")
    assert r.returncode == 0, r.stderr


def test_cli_tiny_model_builds_a_loadable_model(tmp_path):
    r = _cli("tiny-model", str(tmp_path / "tiny"), "--hidden", "32", "--layers", "1")
    assert r.returncode == 0, r.stderr
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(tmp_path / "tiny").hidden_size == 32
    tok = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    assert tok.decode(tok("the moon")["input_ids"]) == "the moon"


def test_cli_lists_flows_and_config_reference():
    assert _cli("flows").stdout.split() == ["train-magrpo", "train-magrpo-centralized", "train-mareinforce", "train-marloo", "train-maremax",
                                            "train-iac", "train-maac", "train-madpo", "train-marlhf",
                                            "train-madpo-iter", "train-marlhf-iter"]
    assert "`trainer.num_generations`" in _cli("config-reference").stdout


def test_shipped_config_works_with_every_flow():
    for algo in ("magrpo", "mareinforce", "marloo", "maremax"):
        r = _cli("validate", "--config", "configs/magrpo-story.yaml", "--algorithm", algo)
        assert r.returncode == 0, r.stderr
        assert f'"algorithm": "{algo}"' in r.stdout
