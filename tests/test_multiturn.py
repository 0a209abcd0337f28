"""Multi-turn tree rollouts: transitions, tree shape and batching, early termination, returns, eval."""

import pytest

from coopflow.stages.agents.spec import specs_for
from coopflow.schemas.config import ConfigError, validate_config
from coopflow.artifacts import ArtifactStore
from coopflow.stages.planning.context import make_context
from coopflow.stages.score.advantages import compute_advantages, joint_returns, tree_children
from coopflow.stages.rollout.generate import SamplingConfig
from coopflow.stages.agents.models import load_policies
from coopflow.stages.score.rewards import RewardCaller, resolve_processor, resolve_reward
from coopflow.stages.rollout.tree import Episode, generate_tree
from coopflow.stages.evaluate.evaluate import evaluate
from coopflow.stages.tasks.transitions import Transition, feedback, plain
from tests import helpers
from tests.conftest import small_config

ITEMS = [{"_item_id": 0, "prompt": "tell a story"}, {"_item_id": 1, "prompt": "describe the moon"}]


# --- transitions ---------------------------------------------------------------------------------


def test_plain_and_feedback_transitions_show_previous_answers():
    out = plain(prompt="P", agent_completions=["ab", "cdef"], num_agents=2, prompt_history_per_agent=[["P"], ["P"]],
                response_history_per_agent=[["ab"], ["cdef"]])
    assert out == ["P\nPrevious answers: agent 1: ab | agent 2: cdef\nRevise your answer."] * 2
    fb = Transition("feedback", {"instruction": "Agent 2: write 2-3x agent 1."})
    out = fb("P", ["ab", "cdef"], [["P"], ["P"]], [["ab"], ["cdef"]], reward=0.5)
    assert out[0] == ("P\nPrevious answers: agent 1 (2 chars): ab | agent 2 (4 chars): cdef\n"
                      "Team score: 0.50 of 1. You are agent 1. Agent 2: write 2-3x agent 1.")
    assert out[1].endswith("You are agent 2. Agent 2: write 2-3x agent 1.")
    assert feedback(prompt="P", agent_completions=["a"], num_agents=1)[0].startswith("P\nPrevious answers: agent 1")


def test_transition_wrong_length_is_a_clear_error():
    bad = Transition("tests.helpers:one_prompt_transition")
    with pytest.raises(ValueError, match="must return a list of 2 prompts"):
        bad("P", ["a", "b"], [["P"], ["P"]], [["a"], ["b"]])
    with pytest.raises(ValueError, match="cannot import module"):
        Transition("nope_module:fn")


def test_config_requires_a_transition_for_more_than_one_turn(tmp_path):
    cfg = small_config(tmp_path)
    cfg["trainer"] = {**cfg["trainer"], "num_turns": 2}
    with pytest.raises(ConfigError, match="transition"):
        validate_config(cfg)
    cfg["transition"] = {"name": "plain"}
    assert validate_config(cfg).transition.name == "plain"
    cfg["reward"] = {"reward_range": [1, 0]}
    with pytest.raises(ConfigError, match="reward.reward_range"):
        validate_config(cfg)


# --- returns -------------------------------------------------------------------------------------


def _s(turn, node, j, r, combo=None):
    return {"step": 0, "item_id": 0, "turn": turn, "node_id": node, "joint_idx": j, "combo": combo or [j, j],
            "reward": r, "reward_raw": r, "env_step": 0}


def _link(turn, node, parent, pj):
    return {"step": 0, "turn": turn, "node_id": node, "parent_node": parent, "parent_joint": pj}


def test_tree_returns_add_the_mean_child_return_by_hand():
    # root (node 0) rewards [1, 0]; child of joint 0 (node 1) rewards [0.5, 0.5]; child of joint 1 (node 2) [1, 0]
    scores = [_s(0, 0, 0, 1.0), _s(0, 0, 1, 0.0), _s(1, 1, 0, 0.5), _s(1, 1, 1, 0.5), _s(1, 2, 0, 1.0), _s(1, 2, 1, 0.0)]
    kids = tree_children([_link(1, 1, 0, 0), _link(1, 2, 0, 1)])
    assert kids == {(0, 0, 0): {0: (0, 1, 1), 1: (0, 1, 2)}}
    R = joint_returns(scores, kids)
    assert R[(0, 0, 0, 0)] == pytest.approx(1.5) and R[(0, 0, 0, 1)] == pytest.approx(0.5)
    assert R[(0, 1, 1, 0)] == 0.5 and R[(0, 1, 2, 1)] == 0.0  # leaves: return = reward
    R = joint_returns(scores, kids, discount=0.5)
    assert R[(0, 0, 0, 0)] == pytest.approx(1.25) and R[(0, 0, 0, 1)] == pytest.approx(0.25)
    # advantages of the root group use the returns [1.5, 0.5]: mean baseline -> [0.5, -0.5], z-norm -> [1, -1]
    adv = compute_advantages(scores, {(0, t, n): 0 for t, n in ((0, 0), (1, 1), (1, 2))}, 2, 2, "aligned", "mean",
                             False, children=kids)
    root = [a for a in adv if a["turn"] == 0 and a["agent"] == 1]
    assert [a["return"] for a in root] == pytest.approx([1.5, 0.5])
    assert [a["advantage"] for a in root] == pytest.approx([0.5, -0.5])


# --- tree generation on the tiny model -----------------------------------------------------------


@pytest.fixture(scope="module")
def policies(tiny_model_dir):
    return load_policies(specs_for([tiny_model_dir, tiny_model_dir], 1e-3))


def _tree(policies, k=2, turns=2, joint="aligned", threshold=None, transition="plain", reward="length_ratio",
          formatters=None):
    counted = []
    run = policies.run

    def counting(op, args):
        counted.append(op.__name__)
        return run(op, args)

    policies.run = counting
    try:
        ep = Episode(turns, joint, Transition(transition), threshold, False, 1.0)
        fmts = formatters or [lambda it: it["prompt"]] * 2
        rows, scores = generate_tree(policies, ITEMS, fmts, SamplingConfig(k, 6, 1.0, 1.0, None), ep,
                                     RewardCaller(resolve_reward(reward), 2), resolve_processor(None), 0, 0, 100)
    finally:
        policies.run = run
    return rows, scores, counted


def test_aligned_tree_shape_batching_and_env_steps(policies):
    helpers.TRANSITION_CALLS.clear()
    rows, scores, ops = _tree(policies, transition="tests.helpers:recording_transition")
    assert ops == ["generate_op", "generate_op"]  # one generate per agent per depth (run() fans out to agents)
    nodes = {(r["turn"], r["node_id"]) for r in rows}
    assert len(nodes) == 2 * (1 + 2)  # 2 items x (root + K children)
    assert len(rows) == 6 * 2 * 2 and len(scores) == 6 * 2
    assert [s["env_step"] for s in scores] == list(range(101, 113))
    assert len({r["node_id"] for r in rows}) == 6  # node ids are unique within the update
    # each child links to its parent's joint action and was prompted from that branch's answers
    text = {(r["node_id"], r["agent"], r["sample"]): r["completion_text"] for r in rows}
    calls = iter(helpers.TRANSITION_CALLS)
    for child in sorted({r["node_id"] for r in rows if r["turn"] == 1}):
        r = next(x for x in rows if x["node_id"] == child and x["agent"] == 1)
        c = next(calls)
        joint = [text[(r["parent_node"], a, r["parent_joint"])] for a in range(2)]
        assert c["agent_completions"] == joint
        assert c["response_history_per_agent"] == [[joint[0]], [joint[1]]]  # histories include the current turn
        assert c["prompt_history_per_agent"] == [[ITEMS[r["item_id"]]["prompt"]]] * 2
        assert c["prompt"] == ITEMS[r["item_id"]]["prompt"] and c["num_agents"] == 2
        assert r["prompt"] == f"turn 2 for agent 2: {c['prompt']}"


def test_cross_tree_has_k_to_the_n_children(policies):
    rows, scores, _ = _tree(policies, joint="cross")
    assert len({(r["turn"], r["node_id"]) for r in rows}) == 2 * (1 + 4)
    assert len(scores) == 2 * 5 * 4


def test_early_termination_stops_branches_above_the_threshold(policies):
    rows, scores, ops = _tree(policies, threshold=-0.2)  # length_ratio >= 0 > -0.2: every root stops
    assert {r["turn"] for r in rows} == {0} and ops == ["generate_op"]
    rows, scores, _ = _tree(policies, threshold=0.5, reward="tests.helpers:turn_tagged_reward")
    assert len({(r["turn"], r["node_id"]) for r in rows}) == 6  # root mean 0.25 <= 0.5: branches continue
    by_turn = {t: {s["reward"] for s in scores if s["turn"] == t} for t in (0, 1)}
    assert by_turn == {0: {0.25}, 1: {1.0}}  # the reward saw each turn's agent-1 prompt


def test_multi_turn_eval_follows_one_path_and_sums_rewards(policies):
    ep = Episode(2, "aligned", Transition("plain"), None, False, 1.0)
    rows, m = evaluate(policies, ITEMS, [lambda it: it["prompt"]] * 2, SamplingConfig(2, 6, 1.0, 1.0, None),
                       RewardCaller(resolve_reward("tests.helpers:turn_tagged_reward"), 2), resolve_processor(None),
                       0, ep)
    assert len(rows) == 2 * 2 * 2  # items x turns x agents, one completion each
    assert m == pytest.approx({"eval/turn_1/reward_mean": 0.25, "eval/turn_1/expected_return": 1.25,
                               "eval/turn_2/reward_mean": 1.0, "eval/turn_2/expected_return": 1.0})


def test_rewards_see_the_turn_and_the_branch_history(policies):
    """A multi-turn node's item carries `_turn` and `_history` (each agent's answers along the branch), so a
    stateful environment can replay a branch; training trees and evaluation alike."""
    helpers.HISTORY_SEEN.clear()
    rows, scores, _ = _tree(policies, turns=2, k=2, reward="tests.helpers:history_reward")
    assert sorted({s["turn"]: s["reward"] for s in scores}.items()) == [(0, 0.0), (1, 1.0)]
    first = {(r["node_id"], r["agent"], r["sample"]): r["completion_text"] for r in rows if r["turn"] == 0}
    for turn, history, _ in helpers.HISTORY_SEEN:
        assert (turn == 0 and history == [[], []]) or (turn == 1 and len(history[0]) == 1)
    parents = {tuple(h[0] for h in history) for turn, history, _ in helpers.HISTORY_SEEN if turn == 1}
    assert parents <= {(first[(n, 0, s0)], first[(n, 1, s1)]) for (n, _, s0) in first for s1 in (0, 1)}
    assert len(parents) == 4  # 2 items x K=2 joint actions, each child sees its own parent's answers
    helpers.HISTORY_SEEN.clear()
    ep = Episode(2, "aligned", Transition("plain"), None, False, 1.0)
    evaluate(policies, ITEMS, [lambda it: it["prompt"]] * 2, SamplingConfig(2, 6, 1.0, 1.0, None),
             RewardCaller(resolve_reward("tests.helpers:history_reward"), 2), resolve_processor(None), 0, ep)
    assert [(t, len(h[0])) for t, h, _ in helpers.HISTORY_SEEN] == [(0, 0), (0, 0), (1, 1), (1, 1)]


def test_eval_with_several_samples_per_item_follows_each_path(policies):
    """samples=3: every (item, sample) is its own sampled path through both turns, the metrics are means over
    items x samples, and the hooks get each item 3 times in a row."""
    ep = Episode(2, "aligned", Transition("plain"), None, False, 1.0)
    seen = {}

    def logger(agent_completions_turns, test_cases, entry_points, prompts):
        seen.update(prompts=prompts, shape=(len(agent_completions_turns), len(agent_completions_turns[0]),
                                            len(agent_completions_turns[0][0])))
        return [{"n": 1}] * len(prompts)

    rows, m = evaluate(policies, ITEMS, [lambda it: it["prompt"]] * 2, SamplingConfig(2, 6, 1.0, 1.0, None),
                       RewardCaller(resolve_reward("tests.helpers:turn_tagged_reward"), 2), resolve_processor(None),
                       0, ep, (logger, lambda d, num_turns: {"count": len(d)}), samples=3)
    assert len(rows) == 2 * 3 * 2 * 2  # items x samples x turns x agents
    assert {(r["item_id"], r["sample"]) for r in rows} == {(i, s) for i in (0, 1) for s in range(3)}
    first = {(r["item_id"], r["sample"]): r["completion_text"] for r in rows if r["turn"] == 0 and r["agent"] == 0}
    second = {(r["item_id"], r["sample"]): r["prompt"] for r in rows if r["turn"] == 1 and r["agent"] == 0}
    assert all(first[p] in second[p] for p in first)  # turn 2 of a path shows that path's own turn-1 answer
    assert len({first[(0, s)] for s in range(3)}) > 1  # the samples are drawn independently
    assert m == pytest.approx({"eval/turn_1/reward_mean": 0.25, "eval/turn_1/expected_return": 1.25,
                               "eval/turn_2/reward_mean": 1.0, "eval/turn_2/expected_return": 1.0,
                               "eval/count": 6.0})
    assert seen == {"prompts": ["tell a story"] * 3 + ["describe the moon"] * 3, "shape": (2, 6, 2)}
    with pytest.raises(ValueError, match="samples per item"):
        evaluate(policies, ITEMS, [lambda it: it["prompt"]] * 2, SamplingConfig(2, 6, 1.0, 1.0, None),
                 RewardCaller(resolve_reward("tests.helpers:turn_tagged_reward"), 2), resolve_processor(None),
                 0, ep, samples=0)


# --- end to end ----------------------------------------------------------------------------------


def test_multi_turn_run_logs_per_turn_metrics_and_reruns_from_cache(tmp_path):
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.stages.planning.keys import segment_record_keys
    from coopflow.flows.driver import run_inline

    cfg = helpers.multiturn_config(tmp_path)
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * (2 + 2 * 2)  # items x (K root joint actions + K children x K)
    store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    assert [len(u.item_ids) for u in ctx.plan.updates] == [1, 1, 1, 1]  # 3 nodes per item fill a buffer of 3
    end = store.find("metrics", segment_record_keys(ctx, len(ctx.end_keys) - 1)[1])
    keys = {r["key"] for r in store.read_rows(end)}
    assert {"turn_1/reward_mean", "turn_1/expected_return", "turn_2/reward_mean", "turn_2/expected_return"} <= keys
    assert {"eval/turn_1/reward_mean", "eval/turn_2/expected_return"} <= set(s["eval"])
    again = run_inline(cfg)
    assert "generate" not in again["executed"] and "update" not in again["executed"]
    assert again["env_steps"] == s["env_steps"]


def test_unreachable_turn_warning_for_the_reference_default_threshold(tmp_path):
    from coopflow.stages.tasks.taskset import build_taskset

    cfg = helpers.multiturn_config(tmp_path, early_termination_threshold=-0.2)
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    assert len(ctx.plan.warnings) == 1 and "no branch ever reaches turn 2" in ctx.plan.warnings[0]
    cfg = helpers.multiturn_config(tmp_path, early_termination_threshold=0.9)
    assert make_context(cfg, store, build_taskset(cfg.taskset, store)).plan.warnings == ()


def test_a_broken_transition_fails_the_run_with_its_name(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = small_config(tmp_path, transition={"name": "tests.helpers:one_prompt_transition"})
    cfg["trainer"] = {**cfg["trainer"], "num_turns": 2, "early_termination_threshold": None}
    with pytest.raises(ValueError, match="one_prompt_transition.*must return a list of 2 prompts"):
        run_inline(validate_config(cfg))


@pytest.mark.slow
def test_multi_turn_magrpo_learns_the_length_ratio_task(tmp_path):
    """The shipped multi-turn example over seeds 0-2: the joint reward (both turns) rises over 2 epochs of 8 items
    (measured gains over seeds 0-4: +0.47 … +0.55; turn-2 eval 0.95 … 1.0)."""
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    gains, evals = [], []
    for seed in helpers.LEARNING_SEEDS:
        cfg = load_config("configs/magrpo-multiturn.yaml", [f"data_dir={tmp_path / str(seed)}", f"seed={seed}"],
                          algorithm="magrpo")
        s = run_inline(cfg)
        gains.append(s["reward_last"] - s["reward_first"])
        evals.append(s["eval"]["eval/turn_2/reward_mean"])
    helpers.assert_learns(gains, 0.2)
    assert sum(evals) / len(evals) > 0.6, evals
