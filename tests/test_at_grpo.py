"""AT-GRPO's pieces on coopflow's stages: team + local rewards mixed per agent, and greedy tree sampling (only a
node's best joint action continues; groups are one agent's K candidates at one turn)."""

import math

import pytest

from coopflow.stages.score.advantages import agent_reward, compute_advantages, local_reward_means
from coopflow.stages.score.rewards import RewardCaller, RewardError
from coopflow.stages.score.scores import score_rewards
from tests.helpers import multiturn_config


def _rollouts(texts):
    """One node (item 7), two agents, K = len(texts[0])."""
    return [{"step": 0, "turn": 0, "node_id": 0, "item_id": 7, "agent": a, "sample": j, "completion_text": t,
             "prompt": "p"} for a, ts in enumerate(texts) for j, t in enumerate(ts)]


def team_and_locals(c1, c2):
    """Team reward: total length; locals: each agent's own length (returns [team, local_1, local_2])."""
    return [len(c1[0]) + len(c2[0]), len(c1[0]), len(c2[0])]


def test_a_reward_may_return_a_team_value_and_one_local_value_per_agent():
    caller = RewardCaller(team_and_locals, 2)
    rows = score_rewards(_rollouts([["a", "bbb"], ["cc", "d"]]), {7: {}}, caller, lambda x: x / 10, "aligned", 0)
    assert [r["reward"] for r in rows] == pytest.approx([0.3, 0.4])
    assert [r["agent_rewards"] for r in rows] == [pytest.approx([0.1, 0.2]), pytest.approx([0.3, 0.1])]


def test_a_reward_with_the_wrong_number_of_values_names_both_shapes():
    caller = RewardCaller(lambda c1, c2: [1.0, 2.0], 2)
    with pytest.raises(RewardError, match=r"returned 2 values .* expected 1 \(the team reward\) or 3"):
        score_rewards(_rollouts([["a"], ["b"]]), {7: {}}, caller, lambda x: x, "aligned", 0)


def _scores(rewards, locals_):
    return [{"step": 0, "turn": 0, "node_id": 0, "joint_idx": j, "combo": [j, j], "reward": r, "agent_rewards": l}
            for j, (r, l) in enumerate(zip(rewards, locals_))]


def test_each_agent_counts_alpha_times_the_team_reward_plus_its_local_reward():
    scores = _scores([1.0, 3.0], [[0.0, 2.0], [1.0, 0.0]])
    assert agent_reward(scores[0], 1, 0.5) == 0.5 * 1.0 + 2.0
    rows = compute_advantages(scores, {(0, 0, 0): 7}, 2, 2, "aligned", "mean", False, team_weight=0.5)
    by = {(r["agent"], r["sample"]): (r["return"], r["advantage"]) for r in rows}
    # agent 0: returns [0.5 + 0, 1.5 + 1] = [0.5, 2.5] -> advantages [-1, 1]
    assert by[(0, 0)] == pytest.approx((0.5, -1.0)) and by[(0, 1)] == pytest.approx((2.5, 1.0))
    # agent 1: returns [0.5 + 2, 1.5 + 0] = [2.5, 1.5] -> advantages [0.5, -0.5]
    assert by[(1, 0)] == pytest.approx((2.5, 0.5)) and by[(1, 1)] == pytest.approx((1.5, -0.5))
    assert local_reward_means(scores, 2) == {"agent_0/local_reward_mean": 0.5, "agent_1/local_reward_mean": 1.0}


def test_without_locals_and_alpha_one_the_returns_are_the_team_rewards():
    scores = _scores([1.0, 3.0], [[], []])
    rows = compute_advantages(scores, {(0, 0, 0): 7}, 2, 2, "aligned", "mean", False)
    assert [r["return"] for r in rows] == [1.0, 3.0, 1.0, 3.0]
    assert local_reward_means(scores, 2) == {}


# --- greedy tree sampling in a run ------------------------------------------------------------------------------


def test_greedy_trees_continue_from_each_nodes_best_joint_action(tmp_path):
    """3 turns, K=2, 4 items: one node per turn (2 joint actions each) instead of 1 + 2 + 4 nodes; every turn-2/3
    node's parent is the best-rewarded joint action of its parent (the first of equals); returns are the turn's own
    rewards (one candidate cannot continue where the others did not)."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.flows.driver import run_inline

    cfg = multiturn_config(tmp_path, num_turns=3, tree_expansion="best")
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 3 * 2
    store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    rollouts, scores, adv = (_all(store, kind) for kind in ("rollouts", "scores", "advantages"))
    reward = {(s["step"], s["turn"], s["node_id"], s["joint_idx"]): s["reward"] for s in scores}
    nodes = {(r["step"], r["turn"], r["node_id"]): r for r in rollouts}
    assert len(nodes) == 4 * 3
    for (step, turn, node_id), r in nodes.items():
        if turn == 0:
            assert r["parent_node"] == -1
            continue
        mine = [reward[(step, turn - 1, r["parent_node"], j)] for j in range(2)]
        assert r["parent_joint"] == mine.index(max(mine))
    for a in adv:
        assert a["return"] == pytest.approx(reward[(a["step"], a["turn"], a["node_id"], a["sample"])])
    assert math.isfinite(s["reward_last"])


def _all(store, kind):
    return [r for _, key in store.artifacts(kind) for r in store.read_rows(store.find(kind, key))]


def test_greedy_expansion_is_part_of_the_rollout_key(tmp_path):
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.planning.keys import update_keys
    from coopflow.stages.tasks.taskset import build_taskset

    keys = []
    for exp in ("all", "best"):
        cfg = multiturn_config(tmp_path / exp, num_turns=3, tree_expansion=exp)
        store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
        ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
        keys.append(update_keys(ctx, ctx.plan.start_key, ctx.plan.updates[0]).rollouts)
    assert keys[0] != keys[1]
