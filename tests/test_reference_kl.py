"""Reference KL: the reference's numbers, identical models give 0, no reference model when disabled."""

from pathlib import Path

import pytest
import torch

from coopflow.stages.agents.spec import specs_for
from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.score.advantages import compute_advantages
from coopflow.stages.agents.models import build_tiny_model, load_agent, load_policies
from coopflow.stages.agents.reference_kl import apply_reference_kl, k3_kl
from coopflow.flows.driver import run_inline
from tests.conftest import small_config


def test_return_adjustment_matches_reference_example():
    assert apply_reference_kl([1.0, 2.0], [0.2, 0.4], 0.5) == pytest.approx([0.9, 1.8])
    with pytest.raises(ValueError, match="2 returns but 1 KL"):
        apply_reference_kl([1.0, 2.0], [0.2], 0.5)


def test_kl_applied_per_agent_before_the_baseline():
    scores = [{"step": 0, "turn": 0, "node_id": 0, "joint_idx": j, "combo": [j, j], "reward": float(j + 1)} for j in range(2)]
    kls = {(0, 0, 0, 0, 0): 0.2, (0, 0, 0, 0, 1): 0.4, (0, 0, 0, 1, 0): 0.0, (0, 0, 0, 1, 1): 0.0}
    rows = compute_advantages(scores, {(0, 0, 0): 7}, 2, 2, "aligned", "raw", False, kls, 0.5)
    by = {(r["agent"], r["sample"]): r for r in rows}
    assert [by[(0, 0)]["return"], by[(0, 1)]["return"]] == pytest.approx([0.9, 1.8])  # agent 0: own KL
    assert [by[(1, 0)]["return"], by[(1, 1)]["return"]] == pytest.approx([1.0, 2.0])  # agent 1: none
    assert by[(0, 1)]["advantage"] == pytest.approx(1.8)  # raw mode: advantage = adjusted return


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-kl"))


def test_k3_of_identical_models_is_zero_and_positive_after_a_change(tiny):
    m, tok = load_agent(tiny)
    ref, _ = load_agent(tiny)
    prompts = [tok("the moon")["input_ids"], tok("a little fox")["input_ids"]]
    comps = [[5, 6, 7], [8, 9]]
    assert k3_kl(m, ref, prompts, comps, tok.pad_token_id) == pytest.approx([0.0, 0.0], abs=1e-6)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    kls = k3_kl(m, ref, prompts, comps, tok.pad_token_id)
    assert all(k > 0 for k in kls)


def test_no_reference_loaded_when_disabled(tiny):
    pol = load_policies(specs_for([tiny], 1e-3))
    assert pol.agents[0].reference is None
    pol = load_policies(specs_for([tiny], 1e-3, references=[str(tiny)]))
    ref = pol.agents[0].reference
    assert ref is not None and ref is not pol.agents[0].model
    assert not any(p.requires_grad for p in ref.parameters())


def test_training_with_reference_kl_records_kl_and_metrics(tmp_path):
    trainer = {**small_config(tmp_path)["trainer"], "reference_kl_enabled": True, "reference_kl_coef": 0.5,
               "rollout_buffer_size": 1}
    cfg = validate_config(small_config(tmp_path, trainer=trainer))
    run_inline(cfg)
    store = ArtifactStore(tmp_path / "artifacts")
    kl_by_update = {}
    for d in (tmp_path / "artifacts" / "rollouts").iterdir():
        rows = store.read_rows(store.find("rollouts", d.name))
        kl_by_update[rows[0]["step"]] = [r["ref_kl"] for r in rows]
    assert kl_by_update[0] == pytest.approx([0.0] * len(kl_by_update[0]), abs=1e-6)  # policy == reference at first
    assert max(max(v) for k, v in kl_by_update.items() if k > 0) > 0  # it drifts after updates
    metrics = [r for d in (tmp_path / "artifacts" / "metrics").iterdir()
               for r in store.read_rows(store.find("metrics", d.name))]
    keys = {r["key"] for r in metrics}
    assert {"turn_1/reference_kl_mean", "turn_1/reference_kl_penalty_mean"} <= keys


def test_reference_kl_in_worker_processes_matches_in_process(tmp_path):
    trainer = {**small_config(tmp_path)["trainer"], "reference_kl_enabled": True, "rollout_buffer_size": 1}
    local = run_inline(validate_config(small_config(tmp_path / "local", trainer=trainer)))
    mp = {**trainer, "parallel_training": "mp", "agent_devices": "cpu"}
    par = run_inline(validate_config(small_config(tmp_path / "mp", trainer=mp)))
    assert par["reward_last"] == local["reward_last"]
    assert Path(par["checkpoint"]).name == Path(local["checkpoint"]).name
