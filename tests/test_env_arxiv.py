"""The arXiv writing environment: the gated four-level reward by hand, the data sources, the shipped config."""

import json

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs import arxiv

DISTINCT = " ".join(f"w{i}" for i in range(150))  # 150 words, 150 unique, no stopwords, no transition words


def test_identical_parts_pass_every_gate():
    """L1 0.5 + L2 1 (r = 1) + L3 0.5 (u = 1) + L4 (T = 0, Jaccard 1 -> 0.6) = 2.6."""
    lv = arxiv.arxiv_levels(DISTINCT, DISTINCT)
    assert lv["reward"] == pytest.approx(2.6) and lv["level4"] == pytest.approx(0.6)
    assert arxiv.arxiv_reward([DISTINCT], [DISTINCT]) == [pytest.approx(2.6)]


def test_transition_categories_raise_level_4():
    """Three categories (contrast, addition, example): T = 0.4 + 0.05 * 2 = 0.5 -> L4 = 0.4 * 0.5 + 0.6."""
    text = "However the results hold. Moreover, for example, " + DISTINCT
    assert arxiv.transition_categories(text) == 3
    assert arxiv.arxiv_levels(text, text)["level4"] == pytest.approx(0.4 * 0.5 + 0.6)
    assert arxiv.transition_categories("the ifs and buts") == 0  # whole words only ('if' is not in 'ifs')


def test_length_ratio_ramp_and_gate():
    short, longer = " ".join(["abcd"] * 150), " ".join(["abcdef"] * 150)  # 749 and 1049 characters
    r = 1049 / 749
    lv = arxiv.arxiv_levels(short, longer)
    assert lv["length_ratio"] == pytest.approx(r) and lv["level2"] == pytest.approx(1 - (r - 1.3) / 0.2)
    assert lv["reward"] == pytest.approx(0.5 + (1 - (r - 1.3) / 0.2) + 0.5 + 0.0)  # Jaccard 0, no transitions
    too_long = " ".join(["abcdefgh"] * 150)  # r = 1349/749 = 1.8: the gate closes after level 1
    assert arxiv.arxiv_levels(short, too_long)["reward"] == 0.5
    assert arxiv.arxiv_levels(longer, short)["reward"] == 0.5  # r = 0.71 < 0.8: closed as well


def test_word_range_and_vocabulary_gates():
    assert arxiv.arxiv_reward([" ".join(["x"] * 100)], [DISTINCT]) == [0.0]  # part 1 has too few words
    assert arxiv.arxiv_reward([DISTINCT], [DISTINCT + " " + DISTINCT]) == [0.0]  # part 2 has 300 words
    few = " ".join(f"w{i % 30}" for i in range(150))  # 30 unique words of 150: u = 0.2 -> stop after level 2
    lv = arxiv.arxiv_levels(DISTINCT, few)
    assert lv["unique_words_ratio"] == pytest.approx(0.2)
    assert lv["reward"] == pytest.approx(0.5 + lv["level2"]) and lv["level2"] > 0
    assert arxiv.arxiv_reward([""], [""]) == [0.0]


def test_eval_hooks_aggregate_levels_and_rates():
    detailed = arxiv.eval_logger([[[DISTINCT], ["x"]], [[DISTINCT], ["y"]]])
    m = arxiv.eval_aggregator(detailed)
    assert m["arxiv/reward_mean"] == pytest.approx(1.3) and m["arxiv/in_word_range_rate"] == 0.5
    assert m["arxiv/optimal_length_ratio_rate"] == 1.0 and m["arxiv/words_1_mean"] == pytest.approx(75.5)


def test_sources_bundled_file_and_errors(tmp_path):
    s = arxiv.arxiv_mini_splits()
    assert (len(s["train"]), len(s["eval"])) == (6, 2) and all(it["prompt"] == it["abstract"] for it in s["train"])
    f = tmp_path / "abstracts.jsonl"
    rows = [{"article_id": str(i), "abstract_text": [f"Sentence one of {i}.", "Sentence two."]} for i in range(5)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    digest, load = arxiv.arxiv_source(str(f))
    got = load()
    assert "arxiv_file_sha256" in digest and len(got["eval"]) == 1 and len(got["train"]) == 4
    assert got["eval"][0]["abstract"] == "Sentence one of 0. Sentence two."
    assert "Sentence one of 1. Sentence two." in arxiv.background_prompt(got["train"][0])
    f.write_text(json.dumps({"article_id": "x", "abstract_text": []}) + "\n")
    with pytest.raises(ValueError, match="row 1: no abstract"):
        arxiv.arxiv_source(str(f))[1]()
    with pytest.raises(FileNotFoundError, match="neither a file nor an HF dataset id"):
        arxiv.arxiv_source(str(tmp_path / "none.jsonl"))
    assert arxiv.arxiv_source("")[0] == {"arxiv_hf": "OpenMLRL/arXiv_abstract"}


def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-arxiv.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 16,
        "taskset.num_items": 2, "formatters": [{"function": "coopflow.envs.arxiv:background_prompt"},
                                               {"function": "coopflow.envs.arxiv:method_prompt"}]},
        algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * 4 and 0.0 <= s["eval"]["eval/turn_1/reward_mean"] <= 3.0
    assert {"eval/arxiv/level1_mean", "eval/arxiv/in_word_range_rate"} <= set(s["eval"])
