"""The clipped multi-epoch objective (PPO/GRPO token ratio, GSPO sequence ratio) against hand-computed values.

A stand-in for the model's token log-probs (a leaf tensor θ, one value per completion token) makes every number
checkable by hand: ρ_t = exp(θ_t − old_t) with old = 0, so ρ_t = exp(θ_t)."""

import math

import pytest
import torch

from coopflow.stages.update import policy_gradient as PG
from coopflow.stages.update.policy_gradient import Objective, clipped_rows_loss, rows_loss

# two completions: row 0 (3 tokens, A = +1), row 1 (2 tokens, A = −1); each weight 1/2
RATIOS = [[1.5, 1.1, 0.5], [0.7, 1.3]]
ROWS = [([1], [5, 6, 7], 1.0, 0.5, ("r", 0)), ([1], [5, 6], -1.0, 0.5, ("r", 1))]
OLD = {("r", 0): torch.zeros(3), ("r", 1): torch.zeros(2)}


@pytest.fixture
def theta(monkeypatch):
    """θ [2, 3] = log ρ (the pad slot of row 1 is 0), returned as the model's token log-probs."""
    t = torch.zeros(2, 3, dtype=torch.float64)
    for b, rs in enumerate(RATIOS):
        t[b, :len(rs)] = torch.tensor([math.log(r) for r in rs], dtype=torch.float64)
    t.requires_grad_(True)

    def fake(model, prompts, completions, pad_id, return_tokens=False, share_prompts=True):
        mask = torch.zeros(2, 3, dtype=torch.float64)
        for b, c in enumerate(completions):
            mask[b, :len(c)] = 1
        tok = t * mask
        return (tok.sum(-1), tok) if return_tokens else tok.sum(-1)

    monkeypatch.setattr(PG, "sequence_logprobs", fake)
    return t


MODEL = torch.nn.Linear(1, 1)


def test_token_ratio_clipped_loss_gradient_and_stats(theta):
    loss, st = clipped_rows_loss(MODEL, ROWS, 0, OLD, Objective(epochs=2, clip_range=0.2))
    # row 0 (A=+1): min(ρ, clip ρ) = [1.2 (clipped), 1.1, 0.5]; row 1 (A=−1): min(−ρ, −clip ρ) = [−0.8 (clipped), −1.3]
    assert loss.item() == pytest.approx(-(0.5 * (1.2 + 1.1 + 0.5) + 0.5 * (-0.8 - 1.3)))
    loss.backward()
    # dρ/dθ = ρ; a clipped token gets no gradient: d loss/dθ_t = −w A ρ_t where the unclipped term is active
    expected = [[0.0, -0.5 * 1.1, -0.5 * 0.5], [0.0, 0.5 * 1.3, 0.0]]
    assert theta.grad.tolist() == [pytest.approx(r) for r in expected]
    assert st["clip_fraction"] == pytest.approx(2 / 5)
    k3 = [r - 1 - math.log(r) for rs in RATIOS for r in rs]
    assert st["approx_kl"] == pytest.approx(sum(k3) / 5)
    assert st["ratio_mean"] == pytest.approx(sum(sum(rs) for rs in RATIOS) / 5)


def test_token_ratio_without_clip_range_is_the_plain_importance_weighted_loss(theta):
    loss, st = clipped_rows_loss(MODEL, ROWS, 0, OLD, Objective(epochs=2, clip_range=None))
    assert loss.item() == pytest.approx(-(0.5 * (1.5 + 1.1 + 0.5) - 0.5 * (0.7 + 1.3)))
    assert st["clip_fraction"] == 0.0


def test_sequence_ratio_is_gspo_length_normalized(theta):
    s0, s1 = (1.5 * 1.1 * 0.5) ** (1 / 3), (0.7 * 1.3) ** (1 / 2)  # 0.938, 0.954: inside [0.8, 1.2]
    loss, st = clipped_rows_loss(MODEL, ROWS, 0, OLD, Objective(epochs=2, clip_range=0.2, ratio_level="sequence"))
    assert loss.item() == pytest.approx(-(0.5 * s0 - 0.5 * s1))
    loss.backward()
    # ds/dθ_t = s / |c|
    assert theta.grad.tolist() == [pytest.approx([-0.5 * s0 / 3] * 3), pytest.approx([0.5 * s1 / 2] * 2 + [0.0])]
    assert st["clip_fraction"] == 0.0


def test_sequence_ratio_clipping(theta):
    # ε = 0.03: row 0 (A=+1, s=0.938 < 0.97) keeps its unclipped term; row 1 (A=−1, s=0.954 < 0.97) is clipped
    s0 = (1.5 * 1.1 * 0.5) ** (1 / 3)
    loss, st = clipped_rows_loss(MODEL, ROWS, 0, OLD, Objective(epochs=2, clip_range=0.03, ratio_level="sequence"))
    assert loss.item() == pytest.approx(-(0.5 * s0 + 0.5 * -0.97))
    loss.backward()
    assert theta.grad[1].tolist() == [0.0, 0.0, 0.0]
    assert st["clip_fraction"] == pytest.approx(0.5)


def test_at_ratio_one_the_token_gradient_is_the_reinforce_gradient(theta):
    with torch.no_grad():
        theta.zero_()  # current = old: ρ = 1
    clipped_rows_loss(MODEL, ROWS, 0, OLD, Objective(epochs=2, clip_range=0.2))[0].backward()
    g_clip = theta.grad.clone()
    theta.grad = None
    rows_loss(MODEL, [r[:4] for r in ROWS], 0).backward()
    assert g_clip.tolist() == theta.grad.tolist()


def test_first_minibatch_captures_the_sampling_log_probs_and_others_must_have_them(theta):
    old = {}
    loss, st = clipped_rows_loss(MODEL, ROWS, 0, old, Objective(epochs=2, clip_range=0.2), capture=True)
    assert st["ratio_mean"] == pytest.approx(1.0) and st["approx_kl"] == pytest.approx(0.0)
    assert old[("r", 0)].tolist() == pytest.approx([math.log(r) for r in RATIOS[0]])
    with pytest.raises(RuntimeError, match="sampling-policy log-probs"):
        clipped_rows_loss(MODEL, ROWS, 0, {}, Objective(epochs=2, clip_range=0.2))


def test_objective_default_is_the_reference_step():
    assert not Objective().uses_ratio
    assert Objective(epochs=2).uses_ratio and Objective(clip_range=0.2).uses_ratio


# --- in a run ----------------------------------------------------------------------------------------------


def _metric_keys(cfg) -> dict[str, float]:
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.planning.keys import segment_record_keys
    from coopflow.stages.tasks.taskset import build_taskset

    store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    rows = store.read_rows(store.find("metrics", segment_record_keys(ctx, len(ctx.end_keys) - 1)[1]))
    return {r["key"]: r["value"] for r in rows}


def test_a_clipped_two_epoch_run_with_agent_normalization_logs_its_statistics(tmp_path):
    """Two passes over a buffer of two minibatches (train_batch_size 1: the second minibatch's sampling log-probs
    come from the no-grad pass before the first step): the run logs clip fraction, approx-KL to the sampling
    policy (> 0: the second pass sees a moved policy) and each agent's advantage statistics (Dr. MAS scope: std 1
    whenever an agent's advantages are not all equal)."""
    from coopflow.schemas.config import validate_config
    from coopflow.flows.driver import run_inline
    from tests.conftest import small_config

    base = small_config(tmp_path)
    cfg = validate_config(small_config(tmp_path, trainer={
        **base["trainer"], "train_batch_size": 1, "num_policy_epochs": 2, "clip_range": 0.2,
        "advantage_normalization_scope": "agent"}))
    s = run_inline(cfg)
    m = _metric_keys(cfg)
    for a in (0, 1):
        assert 0.0 <= m[f"agent_{a}/clip_fraction"] <= 1.0
        assert m[f"agent_{a}/approx_kl"] > 0.0
        assert m[f"agent_{a}/advantage_std"] in (pytest.approx(0.0), pytest.approx(1.0))
    again = run_inline(cfg)
    assert "update" not in again["executed"] and again["checkpoint"] == s["checkpoint"]
