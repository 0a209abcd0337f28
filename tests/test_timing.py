"""What a user timing a run sees (issue 22): the reward's own wall time is counted where it is spent, and
`cache_salt` (`coopflow run --fresh`) makes a run reuse nothing stored."""

from pathlib import Path

from coopflow.schemas.config import validate_config
from coopflow.flows.driver import run_inline
from tests.conftest import small_config


def test_reward_wall_time_is_reported_and_not_counted_as_generation(tmp_path):
    """A reward sleeping 0.1 s per joint action: 8 joint actions -> >= 0.8 s of reward time in the summary."""
    cfg = validate_config(small_config(tmp_path, reward={"name": "tests.helpers:sleepy_length_ratio"}))
    s = run_inline(cfg)
    sec = s["seconds"]
    assert s["env_steps"] == 8
    assert 0.8 <= sec["reward"] <= sec["score"] < 0.8 + 5.0, sec
    assert sec["generate"] < s["train_seconds"] - 0.8, sec  # the reward's sleep is not generation time


def test_a_cache_salt_reuses_nothing_stored(tmp_path):
    base = small_config(tmp_path)
    first = run_inline(validate_config(base))
    again = run_inline(validate_config(base))
    assert "generate" not in again["executed"]  # an identical rerun is served from the store ...
    fresh = run_inline(validate_config({**base, "cache_salt": "fresh-1"}))
    assert fresh["executed"]["generate"] == first["executed"]["generate"]  # ... a salted one computes it all
    assert Path(fresh["checkpoint"]).name != Path(first["checkpoint"]).name
    assert fresh["reward_first"] == first["reward_first"]  # the same seed: the same samples, new keys


def test_eval_before_uses_the_final_evaluations_items_and_seed(tmp_path):
    """With a learning rate too small to change any weight, before == after exactly; a trained run reports both."""
    still = small_config(tmp_path / "still", trainer={**small_config(tmp_path)["trainer"], "agent_learning_rate": 1e-30})
    s = run_inline(validate_config(still))
    assert s["eval_before"] and s["eval_before"] == s["eval"]
    moved = run_inline(validate_config(small_config(tmp_path / "moved")))
    assert moved["eval_before"].keys() == moved["eval"].keys()
    assert moved["eval_before"] == s["eval_before"]  # the same initial policy, items and eval seed
    off = run_inline(validate_config({**small_config(tmp_path / "off"), "eval_before": False}))
    assert "eval_before" not in off
