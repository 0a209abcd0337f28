"""The BFCL travel-booking environment: the simulator replayed per branch, feedback, the per-turn reward."""

import importlib.util

import pytest

from coopflow.schemas.config import load_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                                reason="pip install --no-deps bfcl-eval (.ci/run does)")


@pytest.fixture(scope="module")
def tasks():
    from coopflow.stages.tasks.envs import travel

    s = travel.travel_splits()
    return s["train"] + s["eval"]


def _gt(item):
    return ["\n".join(t) for t in item["ground_truth"]]


def test_the_ground_truth_scores_full_marks_on_every_turn_of_every_task(tasks):
    from coopflow.stages.tasks.envs import travel

    assert len(tasks) == 26
    for it in tasks:
        gt = _gt(it)
        for t in range(len(gt)):
            plan = "\n".join(c.split("(")[0] for c in it["ground_truth"][t])
            assert travel.score_turn(it, t, gt[:t], gt[t], plan) == \
                {"reward": 1.0, "calls": 1.0, "state": 1.0, "plan": 1.0, "unreadable": 0}, (it["task_id"], t)


def test_branches_never_share_simulator_state(tasks):
    """Two branches from the same task: only the one whose turn 0 made the state-changing calls matches the
    ground-truth state at turn 1 (each reward replays its own branch on a fresh simulator)."""
    from coopflow.stages.tasks.envs import travel

    it = next(t for t in tasks if travel.replay(t, _gt(t)[:1]) != travel.simulator(t))
    gt = _gt(it)
    items = [{**it, "_turn": 1, "_history": [["plan"], [gt[0]]]}, {**it, "_turn": 1, "_history": [["plan"], [""]]},
             {**it, "_turn": 1, "_history": [["plan"], [gt[0]]]}]
    r = travel.travel_reward(["x"] * 3, [gt[1]] * 3, batch_items=items)
    assert r[0] == r[2] and r[0] > r[1]  # the same branch scores the same however often it is replayed
    assert travel.score_turn(it, 1, [""], gt[1], None)["state"] == 0.0


def test_feedback_shows_results_errors_and_the_next_request(tasks):
    from coopflow.stages.tasks.envs import travel

    it = tasks[0]
    bad = "get_flight_cost(travel_from='RMS')\nrm_rf(path='/')\nbook_flight(access_token=some_name)"
    out = travel.travel_feedback(prompt="", agent_completions=["plan", bad], num_agents=2, item=it,
                                 response_history_per_agent=[["plan"], [bad]])
    assert len(out) == 2 and out[0] == out[1] and it["turns"][1] in out[0]
    assert "get_flight_cost(travel_from='RMS') -> error: TypeError" in out[0]
    assert "no function 'rm_rf' in this API" in out[0] and "1 call(s) could not be read" in out[0]
    last = len(it["turns"]) - 1
    history = [_gt(it)[:last + 1]] * 2
    end = travel.travel_feedback(prompt="", agent_completions=[history[1][-1]] * 2, num_agents=2, item=it,
                                 response_history_per_agent=history)
    assert travel.DONE in end[0] and "->" in end[0]


def test_malformed_answers_score_zero_calls_and_never_raise(tasks):
    from coopflow.stages.tasks.envs import travel

    it = tasks[1]
    for junk in ["", "((((", "import os; os.system('x')", "book_flight(" * 50, "\x00\x01"]:
        d = travel.score_turn(it, 0, [], junk, "none")
        assert 0.0 <= d["reward"] <= 0.4 and d["calls"] == 0.0  # at most the state part (a no-op turn 0)


def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-travel.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "agents.prompt_overflow": "truncate",  # the tiny model's context (1024) is shorter than these prompts
        "taskset.num_items": 2, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.travel:planner_prompt"},
                       {"function": "coopflow.envs.travel:executor_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * (2 + 2 * 2)  # items x (K root joint actions + K children x K)
    assert {"eval/travel/final_state_match_rate", "eval/turn_2/reward_mean"} <= set(s["eval"])
