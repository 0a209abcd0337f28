"""Advantages and per-agent returns against hand-computed numbers."""

import itertools

import math

import pytest
import torch

from coopflow.stages.score.advantages import ADVANTAGE_MODES, advantages, compute_advantages, per_agent_returns

R4 = [1.0, 2.0, 3.0, 6.0]  # mean 3, max 6, sum 12


def _adv(values, mode, normalize):
    return advantages(torch.tensor(values, dtype=torch.float64), mode, normalize).tolist()


# --- advantages, normalization off -----------------------------------------------------------------


@pytest.mark.parametrize("mode, expected", [
    ("mean", [-2.0, -1.0, 0.0, 3.0]),                    # R - mean(R)
    ("raw", [1.0, 2.0, 3.0, 6.0]),                       # R
    ("max", [-5.0, -4.0, -3.0, 0.0]),                    # R - max(R)
    ("rloo", [1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3]),  # R_k - mean of the others
])
def test_advantage_modes_unnormalized(mode, expected):
    assert _adv(R4, mode, False) == pytest.approx(expected, abs=1e-12)


def test_rloo_hand_values():
    assert _adv(R4, "rloo", False) == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0], abs=1e-12)
    assert _adv(R4, "rloo", False)[0] == pytest.approx(-2.6666667, abs=1e-6)


def test_advantages_accept_float32_and_return_float64():
    A = advantages(torch.tensor(R4, dtype=torch.float32), "mean", False)
    assert A.dtype == torch.float64
    assert A.tolist() == pytest.approx([-2.0, -1.0, 0.0, 3.0])


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="advantage_mode"):
        advantages(torch.tensor(R4), "median", False)


# --- advantages, normalization on ------------------------------------------------------------------


def test_normalized_is_population_zscore():
    # A = R - mean = [-2,-1,0,3]; population var = (4+1+0+9)/4 = 3.5 (sample var would be 14/3).
    s = math.sqrt(3.5)
    expected = [-2 / s, -1 / s, 0.0, 3 / s]
    assert _adv(R4, "mean", True) == pytest.approx(expected, abs=1e-9)
    assert _adv(R4, "mean", True) == pytest.approx([-1.0690450, -0.5345225, 0.0, 1.6035675], abs=1e-6)
    # not the unbiased std
    s_unbiased = math.sqrt(14 / 3)
    assert _adv(R4, "mean", True)[0] != pytest.approx(-2 / s_unbiased, abs=1e-6)


@pytest.mark.parametrize("values", [R4, [0.5, -1.25, 3.0], [10.0, 10.0, 11.0, 7.0, 2.0]])
def test_all_modes_give_same_normalized_result(values):
    ref = _adv(values, "mean", True)
    for mode in ADVANTAGE_MODES:
        assert _adv(values, mode, True) == pytest.approx(ref, abs=1e-9), mode


@pytest.mark.parametrize("mode", ADVANTAGE_MODES)
def test_constant_returns_normalize_to_zero_not_nan(mode):
    A = advantages(torch.tensor([5.0, 5.0, 5.0]), mode, True)
    assert torch.isfinite(A).all()
    assert A.tolist() == [0.0, 0.0, 0.0]


def test_normalization_eps_is_1e_minus_6_floor():
    # A = [-5e-8, 5e-8], population std 5e-8 < eps -> divided by 1e-6, not by the std.
    A = _adv([0.0, 1e-7], "mean", True)
    assert A == pytest.approx([-0.05, 0.05], rel=1e-6)


def test_rloo_single_sample_falls_back_to_mean():
    assert _adv([3.0], "rloo", False) == [0.0]
    assert _adv([3.0], "mean", False) == [0.0]
    # G = 1: no normalization either (raw stays raw)
    assert _adv([3.0], "raw", True) == [3.0]
    assert _adv([3.0], "rloo", True) == [0.0]


# --- per-agent returns -----------------------------------------------------------------------------


_JOINT = itertools.count()


def _score(combo, reward, step=0, turn=0, node_id=0):
    return {"step": step, "turn": turn, "node_id": node_id, "combo": list(combo), "reward": reward,
            "joint_idx": next(_JOINT)}


def test_cross_returns_are_sums_over_combos_containing_completion():
    # K=2, N=2: r(0,0)=1, r(0,1)=2, r(1,0)=3, r(1,1)=4
    scores = [_score((0, 0), 1.0), _score((0, 1), 2.0), _score((1, 0), 3.0), _score((1, 1), 4.0)]
    out = per_agent_returns(scores, num_agents=2, k=2, joint_mode="cross")
    assert list(out) == [(0, 0, 0)]
    agent0, agent1 = out[(0, 0, 0)]
    assert agent0 == [1.0 + 2.0, 3.0 + 4.0]   # own sample 0: combos (0,*), sample 1: combos (1,*)
    assert agent1 == [1.0 + 3.0, 2.0 + 4.0]   # own sample 0: combos (*,0), sample 1: combos (*,1)


def test_cross_returns_three_agents_sum_not_mean():
    # K=2, N=3: reward of combo (a,b,c) = its product index j = 4a + 2b + c
    scores = [_score((a, b, c), float(4 * a + 2 * b + c)) for a in range(2) for b in range(2) for c in range(2)]
    rets = per_agent_returns(scores, num_agents=3, k=2, joint_mode="cross")[(0, 0, 0)]
    assert rets[0] == [0 + 1 + 2 + 3, 4 + 5 + 6 + 7]
    assert rets[1] == [0 + 1 + 4 + 5, 2 + 3 + 6 + 7]
    assert rets[2] == [0 + 2 + 4 + 6, 1 + 3 + 5 + 7]


def test_aligned_returns_identical_for_all_agents():
    scores = [_score((j, j), r) for j, r in enumerate([0.5, -1.0, 2.0])]
    rets = per_agent_returns(scores, num_agents=2, k=3, joint_mode="aligned")[(0, 0, 0)]
    assert rets == [[0.5, -1.0, 2.0], [0.5, -1.0, 2.0]]


def test_returns_grouped_per_node():
    scores = [_score((0, 0), 1.0, node_id=0), _score((1, 1), 2.0, node_id=0),
              _score((0, 0), 7.0, node_id=1), _score((1, 1), 9.0, node_id=1),
              _score((0, 0), -3.0, step=1, node_id=0), _score((1, 1), 3.0, step=1, node_id=0)]
    out = per_agent_returns(scores, num_agents=2, k=2, joint_mode="aligned")
    assert out[(0, 0, 0)][1] == [1.0, 2.0]
    assert out[(0, 0, 1)][0] == [7.0, 9.0]
    assert out[(1, 0, 0)][0] == [-3.0, 3.0]


def test_single_agent_cross_behaves_like_aligned():
    scores = [_score((j,), float(j + 1)) for j in range(3)]
    rets = per_agent_returns(scores, num_agents=1, k=3, joint_mode="cross")[(0, 0, 0)]
    assert rets == [[1.0, 2.0, 3.0]]


# --- compute_advantages ----------------------------------------------------------------------------


def test_compute_advantages_rows_and_values_cross():
    scores = []
    for node_id, base in ((0, 0.0), (1, 10.0)):
        for combo, r in (((0, 0), 1.0), ((0, 1), 2.0), ((1, 0), 3.0), ((1, 1), 4.0)):
            scores.append(_score(combo, base + r, step=5, node_id=node_id))
    item_of_node = {(5, 0, 0): 42, (5, 0, 1): 43}
    rows = compute_advantages(scores, item_of_node, num_agents=2, k=2, joint_mode="cross", mode="mean",
                              normalize=False)
    assert len(rows) == 2 * 2 * 2  # nodes x agents x K
    assert set(rows[0]) == {"step", "item_id", "turn", "node_id", "agent", "sample", "return", "advantage"}
    by = {(r["node_id"], r["agent"], r["sample"]): r for r in rows}
    # node 0, agent 0: returns [3, 7] -> mean-advantages [-2, 2]
    assert by[(0, 0, 0)]["return"] == 3.0 and by[(0, 0, 1)]["return"] == 7.0
    assert by[(0, 0, 0)]["advantage"] == -2.0 and by[(0, 0, 1)]["advantage"] == 2.0
    # node 0, agent 1: returns [4, 6] -> [-1, 1]
    assert (by[(0, 1, 0)]["return"], by[(0, 1, 1)]["return"]) == (4.0, 6.0)
    assert (by[(0, 1, 0)]["advantage"], by[(0, 1, 1)]["advantage"]) == (-1.0, 1.0)
    # node 1 adds 10 to every joint reward: returns +20 per completion, same advantages
    assert (by[(1, 0, 0)]["return"], by[(1, 0, 1)]["return"]) == (23.0, 27.0)
    assert (by[(1, 0, 0)]["advantage"], by[(1, 0, 1)]["advantage"]) == (-2.0, 2.0)
    assert {r["item_id"] for r in rows if r["node_id"] == 0} == {42}
    assert {r["item_id"] for r in rows if r["node_id"] == 1} == {43}
    assert {r["step"] for r in rows} == {5}


def test_compute_advantages_count_aligned_three_agents_normalized():
    K = 4
    scores = [_score((j, j, j), r, node_id=n) for n in range(3) for j, r in enumerate(R4)]
    item_of_node = {(0, 0, n): n for n in range(3)}
    rows = compute_advantages(scores, item_of_node, num_agents=3, k=K, joint_mode="aligned", mode="max",
                              normalize=True)
    assert len(rows) == 3 * 3 * K
    s = math.sqrt(3.5)
    for r in rows:
        assert r["return"] == R4[r["sample"]]
        assert r["advantage"] == pytest.approx([-2 / s, -1 / s, 0.0, 3 / s][r["sample"]], abs=1e-9)


# --- normalization scopes: group (CoMLRL), agent (Dr. MAS), batch (REINFORCE++) ----------------------


def _cross_two_nodes():
    """Two nodes of the cross example above: mean-advantages agent 0 [-2, 2], agent 1 [-1, 1] at both nodes;
    returns agent 0 [3, 7] / [23, 27], agent 1 [4, 6] / [24, 26]."""
    scores = []
    for node_id, base in ((0, 0.0), (1, 10.0)):
        for combo, r in (((0, 0), 1.0), ((0, 1), 2.0), ((1, 0), 3.0), ((1, 1), 4.0)):
            scores.append(_score(combo, base + r, step=5, node_id=node_id))
    return scores, {(5, 0, 0): 0, (5, 0, 1): 1}


def _by_scope(mode, scope, normalize=True):
    scores, items = _cross_two_nodes()
    rows = compute_advantages(scores, items, num_agents=2, k=2, joint_mode="cross", mode=mode, normalize=normalize,
                              scope=scope)
    return {(r["node_id"], r["agent"], r["sample"]): r["advantage"] for r in rows}


def test_group_scope_normalizes_each_node_and_agent_alone():
    A = _by_scope("mean", "group")
    assert [A[(n, a, s)] for n in (0, 1) for a in (0, 1) for s in (0, 1)] == pytest.approx([-1.0, 1.0] * 4)


def test_agent_scope_uses_each_agents_own_statistics():
    # agent 0 pools [-2, 2, -2, 2] (std 2), agent 1 pools [-1, 1, -1, 1] (std 1): both become ±1
    A = _by_scope("mean", "agent")
    assert [A[(n, 0, s)] for n in (0, 1) for s in (0, 1)] == pytest.approx([-1.0, 1.0, -1.0, 1.0])
    assert [A[(n, 1, s)] for n in (0, 1) for s in (0, 1)] == pytest.approx([-1.0, 1.0, -1.0, 1.0])


def test_batch_scope_shares_one_set_of_statistics():
    # pool [-2, 2, -1, 1] x 2: mean 0, population variance (4 + 4 + 1 + 1) / 4 = 2.5
    A = _by_scope("mean", "batch")
    s = math.sqrt(2.5)
    assert [A[(0, 0, 0)], A[(0, 0, 1)], A[(1, 0, 1)]] == pytest.approx([-2 / s, 2 / s, 2 / s])
    assert [A[(0, 1, 0)], A[(1, 1, 1)]] == pytest.approx([-1 / s, 1 / s])


def test_agent_scope_subtracts_the_agents_mean_over_the_batch():
    # raw returns of agent 0: [3, 7, 23, 27]: mean 15, population variance (144 + 64 + 64 + 144) / 4 = 104
    A = _by_scope("raw", "agent")
    s = math.sqrt(104)
    assert [A[(0, 0, 0)], A[(0, 0, 1)], A[(1, 0, 0)], A[(1, 0, 1)]] == pytest.approx(
        [-12 / s, -8 / s, 8 / s, 12 / s])


def test_scope_is_ignored_without_normalization():
    assert _by_scope("mean", "agent", normalize=False) == _by_scope("mean", "group", normalize=False)
    assert _by_scope("mean", "batch", normalize=False)[(0, 0, 1)] == 2.0


def test_unknown_scope_names_the_setting():
    scores, items = _cross_two_nodes()
    with pytest.raises(ValueError, match="advantage_normalization_scope"):
        compute_advantages(scores, items, 2, 2, "cross", "mean", True, scope="global")


def test_advantage_stats_per_agent():
    from coopflow.stages.score.advantages import advantage_stats

    rows = [{"agent": 0, "advantage": v} for v in (-2.0, 2.0)] + [{"agent": 1, "advantage": v} for v in (0.0, 1.0)]
    assert advantage_stats(rows, 2) == pytest.approx({"agent_0/advantage_mean": 0.0, "agent_0/advantage_std": 2.0,
                                                      "agent_1/advantage_mean": 0.5, "agent_1/advantage_std": 0.5})
