"""Preference learning (MADPO / MARLHF): pairs, DPO loss and stop-gradient, reward model, reruns."""

import random

import pytest
import torch

from coopflow.stages.agents.spec import specs_for
from coopflow.schemas.config import ConfigError, validate_config
from coopflow.artifacts import ArtifactStore
from coopflow.stages.planning import context as C
from coopflow.stages.planning.context import formatters_for, make_context
from coopflow.stages.evaluate.evaluate import evaluate
from coopflow.stages.loops import preference as P
from coopflow.stages.score.pairs import build_pairs, select_pairs
from coopflow.stages.fit.reward_model import bt_loss, fit_reward_model, joint_text, load_reward_model, rank_metrics
from coopflow.stages.agents.models import load_agent
from coopflow.stages.agents.state import AgentState
from coopflow.stages.update.dpo import dpo_loss, dpo_step, trim_at_pad
from coopflow.flows.driver import run_inline
from tests.conftest import small_config
from tests.helpers import LEARNING_SEEDS, assert_learns

R = [0.0, 0.5, 0.5, 1.0]  # candidates 1 and 2 tie


# --- pairs ---------------------------------------------------------------------------------------


def test_pair_construction_and_selection_by_hand():
    every = [(1, 0), (2, 0), (3, 0), (3, 1), (3, 2)]  # positive gaps only; the (1, 2) tie is dropped
    assert select_pairs(R, "all", None) == every
    assert select_pairs(R, "reward_gap", None) == [(3, 0), (1, 0), (2, 0), (3, 1), (3, 2)]  # gap 1 first, stable
    assert select_pairs(R, "reward_gap", 2) == [(3, 0), (1, 0)]
    rnd = select_pairs(R, "random", 3, random.Random(7))
    assert len(rnd) == 3 and set(rnd) <= set(every) and rnd == select_pairs(R, "random", 3, random.Random(7))
    assert select_pairs([0.3, 0.3, 0.3], "reward_gap", 16) == []
    with pytest.raises(ValueError, match="pair_selection"):
        select_pairs(R, "best", None)


def test_build_pairs_rows_have_trl_columns_per_agent():
    rollouts = [{"item_id": 7, "agent": a, "sample": j, "prompt": f"p{a}", "completion_text": f"a{a}c{j}",
                 "prompt_ids": [1], "completion_ids": [10 + j]} for a in range(2) for j in range(4)]
    scores = [{"item_id": 7, "joint_idx": j, "reward": r} for j, r in enumerate(R)]
    rows = build_pairs(rollouts, scores, "reward_gap", 2, seed=0)
    assert [(r["pair_id"], r["agent"], r["winner"], r["loser"]) for r in rows] == [
        (0, 0, 3, 0), (0, 1, 3, 0), (1, 0, 1, 0), (1, 1, 1, 0)]
    first = rows[1]
    assert (first["prompt"], first["chosen"], first["rejected"]) == ("p1", "a1c3", "a1c0")
    assert (first["chosen_ids"], first["rejected_ids"], first["candidate_reward_mean"]) == ([13], [10], 0.5)


def test_config_rules():
    with pytest.raises(ConfigError, match="pair_selection 'all' requires preference_pairs_per_sample: null"):
        validate_config({"trainer": {"pair_selection": "all"}}, "madpo")
    with pytest.raises(ConfigError, match="num_turns"):
        validate_config({"trainer": {"num_turns": 2}}, "madpo")
    with pytest.raises(ConfigError, match="num_generations must be >= 2"):
        validate_config({"trainer": {"num_generations": 1}}, "marlhf")
    assert validate_config({"trainer": {"num_generations": 1, "rl_algorithm": "maac"}}, "marlhf")
    assert validate_config({"trainer": {"rl_algorithm": "mareforce"}}, "marlhf").trainer.rl_algorithm == "mareinforce"
    t = validate_config({}, "madpo").trainer
    assert (t.preference_num_candidates, t.preference_pairs_per_sample, t.dpo_beta, t.environment_steps_per_pair,
            t.num_train_epochs, t.top_k) == (80, 16, 0.1, 2, 20, 50)


# --- DPO loss and stop-gradient ------------------------------------------------------------------


def test_dpo_loss_by_hand_and_stop_gradient():
    own = torch.tensor([0.4, -0.2], requires_grad=True)
    others = torch.tensor([1.0, 0.3], requires_grad=True)
    loss = dpo_loss(own, others, beta=0.5)
    z = 0.5 * torch.tensor([1.4, 0.1])
    assert loss.item() == pytest.approx((-torch.nn.functional.logsigmoid(z)).mean().item())
    loss.backward()
    assert others.grad is None  # the other agents' deltas are constants
    # d/d own_k of mean(-log σ(β(own+others))) = -β σ(-z_k) / B
    assert own.grad.tolist() == pytest.approx((-0.5 * torch.sigmoid(-z) / 2).tolist())
    assert trim_at_pad([5, 6, 0, 7, 0], 0) == [5, 6] and trim_at_pad([5, 6], 0) == [5, 6]


def test_dpo_step_only_moves_its_own_agent(tiny_model_dir):
    agents = [AgentState(*load_agent(tiny_model_dir), 1e-2) for _ in range(2)]
    pairs = [{"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10, 11, 12]}]
    before = [p.detach().clone() for p in agents[1].model.parameters()]
    m = dpo_step(agents[0], pairs, [0.7], beta=0.1, index=0)
    assert all(p.grad is None for p in agents[1].model.parameters())
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, agents[1].model.parameters()))
    assert any(p.grad is not None for p in agents[0].model.parameters()) and m["agent_0/dpo_loss"] > 0


# --- reward model --------------------------------------------------------------------------------


def test_bt_loss_and_last_non_pad_pooling_with_right_padding(tiny_model_dir):
    assert bt_loss(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(
        -torch.nn.functional.logsigmoid(torch.tensor(2.0)).item())
    rm = load_reward_model(tiny_model_dir, seed=3)
    texts = ["short", "a much longer joint answer about the moon and the stars"]
    with torch.no_grad():
        batched = rm.score_texts(texts)
        alone = [rm.score_texts([t]).item() for t in texts]
    assert rm.tokenizer.padding_side == "right"
    assert batched.tolist() == pytest.approx(alone, abs=1e-5)
    assert joint_text(["p1", "p2"], ["c1", "c2"]) == (
        "Joint multi-agent response\n\nAgent 1 prompt:\np1\n\nAgent 1 response:\nc1\n\n"
        "Agent 2 prompt:\np2\n\nAgent 2 response:\nc2")


def test_reward_model_learns_to_rank_a_synthetic_preference_set(tiny_model_dir):
    """Winners answer 'the moon', losers 'a story' (varied prompts): held-out pairs are ranked correctly."""
    rng = random.Random(0)
    words = ["cat", "dog", "sea", "sun", "tree", "bird", "rain", "king", "road", "ship", "star", "wind"]

    def pair(i):
        p = [" ".join(rng.sample(words, 3)) for _ in range(2)]
        return i, (joint_text(p, ["the moon shines", "the moon glows"]), joint_text(p, ["a story", "a tale"]))

    train, held = dict(pair(i) for i in range(24)), dict(pair(i) for i in range(24, 40))
    rm = load_reward_model(tiny_model_dir, seed=1)
    assert rank_metrics(rm, held)["reward_model/accuracy"] < 0.9
    fit_reward_model(rm, train, lr=1e-3, epochs=3, batch_size=4, seed=0)
    assert rank_metrics(rm, held)["reward_model/accuracy"] >= 0.9


# --- runs: no pairs, reruns ----------------------------------------------------------------------


def _cfg(tmp_path, algo, **trainer):
    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_train_epochs": 1, "agent_learning_rate": 1e-3, "max_new_tokens": 8, "temperature": 1.0,
                      "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "train_batch_size": 2,
                      "eval_interval": 0, "eval_num_samples": 2, "logging_steps": 1, **trainer}
    if algo == "marlhf":
        cfg["trainer"].update(num_generations=2, rollout_buffer_size=2)
    return validate_config(cfg, algo)


def test_no_pairs_is_a_clear_message(tmp_path):
    cfg = _cfg(tmp_path, "madpo")
    cfg.reward.name = "tests.helpers:constant_reward"
    with pytest.raises(P.NoPairs, match="no preference pairs: every item's candidates tied"):
        run_inline(cfg)


def test_madpo_reruns_only_what_a_change_touches(tmp_path):
    first = run_inline(_cfg(tmp_path, "madpo"))
    assert first["env_steps"] == 2 * first["pair_count"]  # environment_steps_per_pair x pairs, one epoch
    d = run_inline(_cfg(tmp_path, "madpo", dpo_beta=0.3, agent_learning_rate=2e-3))["executed"]
    assert "generate" not in d and "score" not in d and "pairs" not in d
    assert d["update"] >= 1 and d["evaluate"] == 1
    again = run_inline(_cfg(tmp_path, "madpo", pair_selection="random"))
    d = again["executed"]
    assert d["pairs"] == 1 and "generate" not in d and "score" not in d and again["candidates"] == first["candidates"]


def test_marlhf_reruns_only_the_reward_model_and_downstream(tmp_path):
    first = run_inline(_cfg(tmp_path, "marlhf"))
    assert set(first["reward_model"]) >= {"reward_model/accuracy", "reward_model/margin"}
    assert set(first["eval"]) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    again = run_inline(_cfg(tmp_path, "marlhf", reward_learning_rate=3e-5))
    d = again["executed"]
    assert d["fit_reward_model"] == 1 and "pairs" not in d and d["update"] >= 1
    # no new candidates; of the RL phase's 2 updates the first reuses its rollouts (they depend only on the
    # initial policy, not on the reward model), the second generates anew
    assert d["generate"] == 1
    assert again["pairs"] == first["pairs"] and again["reward_model"] != first["reward_model"]


@pytest.mark.slow
def test_madpo_moves_the_task_reward(tmp_path):
    """The shipped MADPO config over seeds 0-2: the trained agents' eval reward beats the initial agents' (same
    eval seed); measured gains over seeds 0-4: +0.12, +0.24, +0.09, +0.19, +0.02."""
    from coopflow.schemas.config import load_config
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.stages.common.seeds import derive_seed
    from coopflow.stages.agents.models import load_policies

    gains = []
    for seed in LEARNING_SEEDS:
        d = tmp_path / str(seed)
        cfg = load_config("configs/madpo-story.yaml", [f"data_dir={d}", f"seed={seed}"], algorithm="madpo")
        after = run_inline(cfg)["eval"]["eval/turn_1/reward_mean"]
        store = ArtifactStore(d / "artifacts")
        ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
        pol = load_policies(specs_for(ctx.sources, 1e-3))
        _, before = evaluate(pol, ctx.eval_items[:cfg.trainer.eval_num_samples], formatters_for(ctx, pol),
                             ctx.sampling, ctx.caller, ctx.processor, derive_seed(cfg.seed, "final-eval"), ctx.episode)
        gains.append(after - before["eval/turn_1/reward_mean"])
    assert_learns(gains, 0.05)


def _marlhf_gain(tmp_path, seed: int, overrides: tuple = ()) -> tuple[float, dict]:
    """Task-reward gain of the shipped MARLHF config at `seed` (eval of the trained vs the initial agents)."""
    from coopflow.schemas.config import load_config
    from coopflow.stages.agents.models import load_policies
    from coopflow.stages.common.seeds import derive_seed
    from coopflow.stages.tasks.taskset import build_taskset

    cfg = load_config("configs/marlhf-story.yaml", [f"data_dir={tmp_path}", f"seed={seed}", *overrides],
                      algorithm="marlhf")
    out = run_inline(cfg)
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    pol = load_policies(specs_for(ctx.sources, 1e-3))
    _, before = evaluate(pol, ctx.eval_items[:cfg.trainer.eval_num_samples], formatters_for(ctx, pol),
                         ctx.sampling, ctx.caller, ctx.processor, derive_seed(cfg.seed, "final-eval"), ctx.episode)
    return out["eval"]["eval/turn_1/reward_mean"] - before["eval/turn_1/reward_mean"], out


@pytest.mark.slow
def test_marlhf_moves_the_task_reward(tmp_path):
    """The shipped MARLHF config with 4 RL epochs over 3 seeds: RL on the fitted reward model climbs it, and the
    *task* reward follows on average. Measured on one 2-core machine, one torch thread: gains +0.25, +0.11,
    +0.008 on seeds 0-2 (with the shipped 2 epochs: -0.001, +0.23, -0.007 there, while another machine had
    +0.29 on seed 0: two epochs are too few for the task reward to follow on every CPU)."""
    gains = []
    for seed in LEARNING_SEEDS:
        gain, out = _marlhf_gain(tmp_path / f"seed{seed}", seed, ("trainer.num_train_epochs=4",))
        assert out["reward_model"]["reward_model/accuracy"] > 0.9  # the RM ranks its training pairs
        assert out["rm_reward_last"] > out["rm_reward_first"], out  # RL climbs the reward model ...
        gains.append(gain)
    # ... and the task reward follows: on average, and on at least 2 of the 3 seeds
    assert_learns(gains, 0.05, min_improving=2)


@pytest.mark.parametrize("rl", ["maac", "iac"])
def test_marlhf_actor_critic_backends(tmp_path, rl):
    cfg = _cfg(tmp_path, "marlhf", rl_algorithm=rl, num_generations=1, critic_learning_rate=1e-3)
    rcfg = C.rl_config(cfg)
    assert rcfg.algorithm == rl and rcfg.critic.critic_model == "tiny" and rcfg.trainer.critic_learning_rate == 1e-3
    out = run_inline(cfg)
    assert set(out["eval"]) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    crit = "critic" if rl == "maac" else "agent_0/critic"
    assert (__import__("pathlib").Path(out["checkpoint"]) / crit / "value_head.pt").is_file()
