"""Joint actions and reward scoring on hand-made rollout rows."""

import math
import random

import pytest

from coopflow.schemas.tables import TABLES
from coopflow.stages.score.rewards import RewardCaller, resolve_processor
from coopflow.stages.score.scores import joint_combos, score_rewards

# --- joint combos ----------------------------------------------------------------------------------


@pytest.mark.parametrize("k, n, mode, count", [
    (4, 2, "aligned", 4), (3, 3, "aligned", 3),
    (3, 2, "cross", 9), (2, 3, "cross", 8), (4, 2, "cross", 16),
    (5, 1, "cross", 5), (5, 1, "aligned", 5),
])
def test_joint_combo_counts(k, n, mode, count):
    combos = joint_combos(k, n, mode)
    assert len(combos) == count
    assert len(set(combos)) == count
    assert all(len(c) == n for c in combos)


def test_joint_combo_values():
    assert joint_combos(3, 2, "aligned") == [(0, 0), (1, 1), (2, 2)]
    assert joint_combos(2, 2, "cross") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert joint_combos(3, 1, "cross") == [(0,), (1,), (2,)]


def test_joint_combo_bad_mode_raises():
    with pytest.raises(ValueError, match="joint_mode"):
        joint_combos(2, 2, "diagonal")


# --- score_rewards ---------------------------------------------------------------------------------

ITEMS = {7: {"prompt": "tell a story"}, 8: {"prompt": "describe the moon"}}


def _rollouts(k: int, n: int, nodes=((0, 0, 7), (0, 1, 8)), text=lambda node_id, a, s: f"{s}"):
    """Hand-made rows with exactly the `rollouts` schema's keys; shuffled to test node ordering."""
    rows = []
    for step, node_id, item_id in nodes:
        for a in range(n):
            for s in range(k):
                t = text(node_id, a, s)
                rows.append({"step": step, "item_id": item_id, "turn": 0, "node_id": node_id, "agent": a,
                             "sample": s, "prompt": ITEMS[item_id]["prompt"], "prompt_ids": [1, 2],
                             "completion_ids": [3] * len(t), "completion_text": t, "length": len(t),
                             "finished": True, "ref_kl": 0.0, "parent_node": -1, "parent_joint": -1})
    assert all(set(r) == set(TABLES["rollouts"].names) for r in rows)
    random.Random(0).shuffle(rows)
    return rows


def digits2(c1, c2):
    """Reward that encodes the combo: 10*int(agent-0 text) + int(agent-1 text) + 1."""
    return [10 * int(c1[0]) + int(c2[0]) + 1]


def test_score_rewards_aligned_env_steps_processor_combos():
    rows = _rollouts(k=3, n=2)
    out = score_rewards(rows, ITEMS, RewardCaller(digits2, 2), resolve_processor("scale:100"), "aligned",
                        env_step_base=10)
    assert len(out) == 2 * 3
    assert all(set(r) == set(TABLES["scores"].names) for r in out)
    assert [r["env_step"] for r in out] == [11, 12, 13, 14, 15, 16]
    assert [r["node_id"] for r in out] == [0, 0, 0, 1, 1, 1]
    assert [r["item_id"] for r in out] == [7, 7, 7, 8, 8, 8]
    assert [r["joint_idx"] for r in out] == [0, 1, 2] * 2
    assert [r["combo"] for r in out] == [[0, 0], [1, 1], [2, 2]] * 2
    assert [r["reward_raw"] for r in out] == [1.0, 12.0, 23.0] * 2
    assert [r["reward"] for r in out] == [100.0, 1200.0, 2300.0] * 2
    assert all(r["step"] == 0 and r["turn"] == 0 for r in out)


def test_score_rewards_cross_mode():
    rows = _rollouts(k=2, n=2, nodes=((3, 0, 7),))
    out = score_rewards(rows, ITEMS, RewardCaller(digits2, 2), resolve_processor(None), "cross", env_step_base=0)
    assert [r["combo"] for r in out] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert [r["reward_raw"] for r in out] == [1.0, 2.0, 11.0, 12.0]
    assert [r["reward"] for r in out] == [1.0, 2.0, 11.0, 12.0]
    assert [r["env_step"] for r in out] == [1, 2, 3, 4]
    assert [r["joint_idx"] for r in out] == [0, 1, 2, 3]
    assert {r["step"] for r in out} == {3}


def test_score_rewards_cross_three_agents_counts():
    rows = _rollouts(k=2, n=3, nodes=((0, 0, 7),))
    out = score_rewards(rows, ITEMS, RewardCaller(lambda a, b, c: [int(a[0]) * 4 + int(b[0]) * 2 + int(c[0])], 3),
                        resolve_processor(None), "cross", env_step_base=100)
    assert [r["reward_raw"] for r in out] == [float(j) for j in range(8)]
    assert out[-1]["env_step"] == 108


def test_score_rewards_single_agent():
    rows = _rollouts(k=3, n=1, nodes=((0, 0, 7),), text=lambda node_id, a, s: "x" * (s + 1))
    out = score_rewards(rows, ITEMS, RewardCaller(lambda c: [float(len(c[0]))], 1),
                        resolve_processor("clamp:0:2"), "aligned", env_step_base=0)
    assert [r["combo"] for r in out] == [[0], [1], [2]]
    assert [r["reward_raw"] for r in out] == [1.0, 2.0, 3.0]
    assert [r["reward"] for r in out] == [1.0, 2.0, 2.0]


def test_score_rewards_passes_the_items_prompt_and_item():
    seen = []

    def reward(prompts, c1, c2, batch_items=None):
        seen.append((list(prompts), batch_items))
        return [0.0]

    score_rewards(_rollouts(k=2, n=2), ITEMS, RewardCaller(reward, 2), resolve_processor(None), "aligned", 0)
    assert seen == [(["tell a story"], [ITEMS[7]])] * 2 + [(["describe the moon"], [ITEMS[8]])] * 2


def test_score_rewards_cross_passes_batch_items():
    seen = []

    def reward(c1, c2, batch_items=None):
        seen.append(batch_items)
        return 1.0

    score_rewards(_rollouts(k=2, n=2, nodes=((0, 0, 8),)), ITEMS, RewardCaller(reward, 2), resolve_processor(None),
                  "cross", 0)
    assert seen == [[ITEMS[8]]] * 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("mode", ["aligned", "cross"])
def test_score_rewards_non_finite_reward_raises(bad, mode):
    with pytest.raises(FloatingPointError, match="item 7"):
        score_rewards(_rollouts(k=2, n=2, nodes=((0, 0, 7),)), ITEMS, RewardCaller(lambda c1, c2: [bad], 2),
                      resolve_processor(None), mode, 0)
