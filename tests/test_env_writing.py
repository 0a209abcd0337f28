"""The TL;DR writing environment: bundled posts, the dual-length reward against hand-computed values."""

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs import writing


def test_bundled_posts_split_12_4():
    sp = writing.tldr_mini_splits()
    assert len(sp["train"]) == 12 and len(sp["eval"]) == 4
    assert all(r["prompt"].endswith("Summarise this post.") and r["post"] in r["prompt"] for r in sp["train"])


def test_dual_length_reward_by_hand():
    s220 = "x" * 220
    cases = [
        (s220, "y" * 550, 1.0),                        # short on target, ratio 2.5: both scores 1
        (s220, "y" * 220, 0.5 * ((1 - 1 / 2) + 1)),    # ratio 1 below [2, 3]: ratio score 1 - (2-1)/2 = 0.5
        (s220, "y" * 880, 0.5 * ((1 - 1 / 3) + 1)),    # ratio 4 above: 1 - (4-3)/3
        ("x" * 110, "y" * 275, 0.5 * (1 + 0.0)),       # short 110 chars: 1 - 110/110 = 0; ratio 2.5
        ("x" * 10, "y" * 1000, -1.0 * 0.5 + 0.5 * max(-1, 1 - 210 / 110)),  # ratio 100: clamped -1; short -0.909
        ("", "y" * 500, -1.0),                         # empty -> -1
    ]
    got = writing.dual_length_reward([c[0] for c in cases], [c[1] for c in cases])
    assert got == pytest.approx([c[2] for c in cases])
    assert writing.dual_length_reward.reward_range == (-1.0, 1.0)


def test_length_metrics_per_agent():
    samples = [{"agent": 0, "completion_text": "ab"}, {"agent": 0, "completion_text": "abcd"},
               {"agent": 1, "completion_text": "abcdef"}]
    assert writing.length_metrics(samples) == {"agent_0/char_length_mean": 3.0, "agent_1/char_length_mean": 6.0}


def test_eval_hooks_report_lengths_ratio_and_target_rates():
    short, long = ["s" * 220, "s" * 100, ""], ["l" * 550, "l" * 400, "l" * 10]
    detailed = writing.eval_logger([[[x] for x in short], [[x] for x in long]])
    assert [d["ratio"] for d in detailed] == [2.5, 4.0, 0.0]
    m = writing.eval_aggregator(detailed)
    assert m == pytest.approx({"short/char_length_mean": 320 / 3, "long/char_length_mean": 960 / 3,
                               "long_short_ratio_mean": 6.5 / 3, "ratio_in_range_rate": 1 / 3,
                               "short_on_target_rate": 1 / 3})


def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-tldr.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 24,
        "taskset.num_items": 4, "formatters": None}, algorithm="magrpo")  # the tiny model has no chat template
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 4 and -1.0 <= s["eval"]["eval/turn_1/reward_mean"] <= 1.0
    assert {"eval/short/char_length_mean", "eval/ratio_in_range_rate"} <= set(s["eval"])


def test_the_hf_tldr_path_reads_a_local_dataset_of_the_same_shape(tmp_path):
    """`taskset.name: hf:trl-lib/tldr` online; offline the same loader reads a local dataset dir of that shape."""
    import json

    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import TasksetConfig
    from coopflow.stages.tasks.taskset import build_taskset, load_items

    d = tmp_path / "tldr"
    d.mkdir()
    for split, posts in (("train", writing.POSTS[:3]), ("validation", writing.POSTS[3:5])):
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"prompt": p + "\nTL;DR:", "completion": " short."}) + "\n"
                                                  for p in posts))
    store = ArtifactStore(tmp_path / "artifacts")
    ref = build_taskset(TasksetConfig(name=f"hf:{d}", split="train", eval_split="validation"), store)
    train, ev = load_items(store, ref, "train"), load_items(store, ref, "eval")
    assert len(train) == 3 and len(ev) == 2 and train[0]["prompt"].endswith("TL;DR:")
    assert writing.dual_length_reward(["x" * 220], ["y" * 550]) == [1.0]
