"""Iterative preference rounds, the pure parts: replay modes, index-aligned comparator pairs, drift log."""

import random
from collections import Counter

import pytest

from coopflow.stages.score.pairs import aligned_comparisons
from coopflow.stages.score.replay import check_replay, sample_replay, shard_weights
from coopflow.stages.evaluate.reward_drift import bar_svg, drift_metrics, drift_record, histogram


# --- replay --------------------------------------------------------------------------------------


def test_replay_weights_by_hand():
    assert shard_weights(4, "current") == [0, 0, 0, 1]
    assert shard_weights(4, "nearest_k", k=2) == [0, 0, 1, 1]
    assert shard_weights(2, "nearest_k", k=5) == [1, 1]
    assert shard_weights(3, "all_history") == [1, 1, 1]
    # (1 - λ) λ^age, age 0 = newest: λ = 0.5 -> [0.125, 0.25, 0.5]
    assert shard_weights(3, "lambda_decay", lam=0.5) == pytest.approx([0.125, 0.25, 0.5])
    assert shard_weights(3, "lambda_decay", lam=1.0) == [1, 1, 1]
    assert shard_weights(3, "lambda_decay", lam=0.0) == [0, 0, 1]


@pytest.mark.parametrize("mode, k, lam, size, msg", [
    ("current", 2, None, None, "'current'"), ("current", None, 0.5, None, "'current'"),
    ("nearest_k", None, None, None, "requires preference_replay_k"), ("nearest_k", 2, 0.5, None, "does not take"),
    ("all_history", 2, None, None, "takes neither"), ("lambda_decay", None, None, None, "requires"),
    ("lambda_decay", None, 1.5, None, "in \\[0, 1\\]"), ("lambda_decay", 2, 0.5, None, "does not take"),
    ("all_history", None, None, 0, ">= 1"), ("fifo", None, None, None, "must be one of"),
])
def test_replay_config_rules(mode, k, lam, size, msg):
    with pytest.raises(ValueError, match=msg):
        check_replay(mode, k, lam, size)


def test_replay_sampling_on_fixed_seeds():
    shards = [[f"a{i}" for i in range(4)], [f"b{i}" for i in range(4)], [f"c{i}" for i in range(3)]]
    cur = sample_replay(shards, "current", None, None, None, random.Random(0))
    assert sorted(cur) == sorted(shards[-1])
    near = sample_replay(shards, "nearest_k", 2, None, 6, random.Random(0))
    assert len(near) == 6 and all(r[0] in "bc" for r in near)
    assert near == sample_replay(shards, "nearest_k", 2, None, 6, random.Random(0))  # reproducible
    big = sample_replay(shards, "all_history", None, None, 3000, random.Random(1))
    share = Counter(r[0] for r in big)
    assert all(abs(share[s] / 3000 - 1 / 3) < 0.04 for s in "abc")
    decay = sample_replay(shards, "lambda_decay", None, 0.5, 7000, random.Random(2))
    share = Counter(r[0] for r in decay)  # weights 1 : 2 : 4
    assert abs(share["a"] / 7000 - 1 / 7) < 0.03 and abs(share["c"] / 7000 - 4 / 7) < 0.03
    # within a shard: without replacement until a full pass is used up
    one = sample_replay([["x", "y", "z"]], "all_history", None, None, 3, random.Random(3))
    assert sorted(one) == ["x", "y", "z"]
    # the size defaults to this round's count, else the last non-empty shard's
    assert len(sample_replay(shards, "all_history", None, None, None, random.Random(0))) == 3
    assert len(sample_replay([["p", "q"], []], "all_history", None, None, None, random.Random(0))) == 2


# --- index-aligned comparator pairs --------------------------------------------------------------


def test_aligned_comparisons_by_hand():
    target = [0.25, 1.0, 0.5, 0.0, 0.75]
    comp = [0.75, 0.0, 0.5, 0.625]  # P_c = 4 < P: index 4 has no partner; index 2 ties
    assert aligned_comparisons(target, comp, "all", None) == [(0, False), (1, True), (3, False)]
    # comparator_reward: comparator reward descending (.75, .625, 0), then |gap|
    assert aligned_comparisons(target, comp, "comparator_reward", None) == [(0, False), (3, False), (1, True)]
    assert aligned_comparisons(target, comp, "reward_gap", 2) == [(1, True), (3, False)]  # gaps 1, .625, .5
    r = aligned_comparisons(target, comp, "random", 2, random.Random(5))
    assert len(r) == 2 and r == aligned_comparisons(target, comp, "random", 2, random.Random(5))


# --- reward drift ---------------------------------------------------------------------------------


def test_drift_histograms_and_record():
    assert histogram([0.0, 0.03, 0.5, 1.0, 1.7, -3.0], 0.0, 1.0) == [3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 2]
    rec = drift_record(2, 0.0, 1.0, [0.1, 0.9], [0.5], [0.9], [0.5])
    assert rec["num_bins"] == 16 and len(rec["bin_edges"]) == 17 and rec["bin_centers"][0] == pytest.approx(1 / 32)
    assert rec["candidate"]["target"]["counts"][1] == 1 and rec["candidate"]["target"]["mean"] == pytest.approx(0.5)
    assert set(rec["candidate"]["target"]) == {"sample_count", "mean", "counts", "raw_rewards"}  # counts, no density
    m = drift_metrics(rec)
    assert m["iter/reward_distribution/current_iteration"] == 2 and m["iter/selected_reward_distribution/pair_count"] == 1
    svg = bar_svg(rec)
    assert svg.startswith("<svg") and 'width="240"' in svg and "#f28e2b" in svg and ">reward<" in svg
    with pytest.raises(ValueError, match="min < max"):
        histogram([1.0], 1.0, 1.0)
