"""Centralized collaboration: one joint actor writes every role's output; the adapter, config, run and loss."""

from pathlib import Path

import pytest
import torch

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import ConfigError, validate_config
from coopflow.stages.agents.checkpoint import CheckpointLayout
from coopflow.flows.driver import run_inline
from coopflow.stages.tasks.centralized import (CentralizedComparatorParseError, CentralizedReward, TaggedAdapter,
                                      split_roles)
from coopflow.stages.score.rewards import RewardCaller
from tests.conftest import small_config
from tests.helpers import LEARNING_SEEDS, ROLE_SPLITS_SEEN, assert_learns


def centralized(tmp, adapter="tests.helpers:FixedSplitAdapter", **trainer):
    return small_config(tmp, centralized_adapter=adapter,
                        trainer={**small_config(tmp)["trainer"], "collaboration_mode": "centralized", **trainer})


# --- the tagged adapter --------------------------------------------------------------------------


def test_tagged_adapter_three_roles_round_trip():
    a = TaggedAdapter()
    prompt = a.build_prompt({"id": 1}, ["first role", "second role", "third role"])
    for i, p in enumerate(["first role", "second role", "third role"]):
        assert f"Agent {i} original prompt:\n{p}" in prompt
    assert "<agent_2>" in prompt and "<agent_3>" not in prompt
    text = "<agent_0> a </agent_0>\n<AGENT_1>b\nc</Agent_1><agent_2>d</agent_2>"
    assert a.parse_completion(text, {}, 3) == ["a", "b\nc", "d"]  # case-insensitive, multi-line, stripped
    assert a.parse_completion("<agent_1>only</agent_1>", {}, 3) == ["", "only", ""]  # a missing section is ""


def test_tagged_adapter_parse_error_gives_empty_roles():
    with pytest.raises(CentralizedComparatorParseError):
        TaggedAdapter().parse_completion("plain text", {}, 2)
    assert issubclass(CentralizedComparatorParseError, ValueError)
    assert split_roles(TaggedAdapter(), "plain text", {}, 2) == (["", ""], False)


def test_wrong_role_count_is_the_adapters_bug():
    class One(TaggedAdapter):
        def parse_completion(self, completion, batch_item, num_agents):
            return [completion]

    with pytest.raises(ValueError, match="exactly 2 outputs"):
        split_roles(One(), "x", {}, 2)


def test_centralized_reward_scores_the_roles_with_the_task_reward():
    seen = []

    def task(prompts, c1, c2):
        seen.append((prompts, c1, c2))
        return [len(c2[0]) - len(c1[0])]

    task.reward_range = (-5.0, 5.0)
    r = CentralizedReward(RewardCaller(task, 2), TaggedAdapter(), lambda item: f"role0 of {item['id']}")
    assert r.reward_range == (-5.0, 5.0)
    caller = RewardCaller(r, 1)
    assert caller([["<agent_0>ab</agent_0><agent_1>abcde</agent_1>"]], ["joint"], [{"id": 7}]) == [3.0]
    assert seen[-1] == (["role0 of 7"], ["ab"], ["abcde"])  # N one-element lists, role 0's prompt
    assert caller([["no tags"]], ["joint"], [{"id": 7}]) == [0.0]  # parse error -> every role ""


# --- config ---------------------------------------------------------------------------------------


def test_config_checks(tmp_path):
    cfg = validate_config(centralized(tmp_path))
    assert cfg.centralized and cfg.actor_sources() == ["tiny"] and cfg.agents.n == 2
    alias = validate_config(centralized(tmp_path, collaboration_mode="single_agent"))
    assert alias.trainer.collaboration_mode == "centralized"
    with pytest.raises(ConfigError, match="num_turns must be 1"):
        validate_config({**centralized(tmp_path, num_turns=2), "transition": {"name": "plain"}})
    with pytest.raises(ConfigError, match="exactly one actor"):
        validate_config({**centralized(tmp_path), "agents": {"agents": ["tiny", "./other"], "num_agents": 2}})
    with pytest.raises(ConfigError, match="collaboration_mode"):
        validate_config(centralized(tmp_path, collaboration_mode="both"))


# --- a run ------------------------------------------------------------------------------------------


def test_run_trains_one_actor_and_counts_env_steps(tmp_path):
    """4 items x K=2 x 1 epoch = 8 env steps (one per joint response); the checkpoint holds agent_0 only; the
    eval logger sees the split roles; an adapter that cannot parse is counted."""
    ROLE_SPLITS_SEEN.clear()
    data = {**centralized(tmp_path), "eval_logger": "tests.helpers:recording_eval_logger",
            "eval_aggregator": "tests.helpers:recording_eval_aggregator"}
    data["agents"] = {**data["agents"], "num_agents": 3}
    data["reward"] = {"name": "tests.helpers:last_two_length_ratio"}
    s = run_inline(validate_config(data))
    assert s["env_steps"] == 4 * 2
    lay = CheckpointLayout(Path(s["checkpoint"]))
    assert lay.agent(0).is_dir() and not lay.agent(1).exists()
    assert s["eval"]["eval/turn_1/agents_seen"] == 3.0  # the logger got the 3 roles, not the one joint actor
    roles = ROLE_SPLITS_SEEN[-1]
    assert len(roles) == 3 and all(len(r) == 2 for r in roles)  # [role][eval item][turn]
    # the tagged adapter on a random tiny model: no sections, every joint answer a parse failure, reward 0
    cfg = validate_config(centralized(tmp_path / "tagged", adapter=None))
    t = run_inline(cfg)
    store = ArtifactStore(tmp_path / "tagged" / "artifacts")
    refs = [store.find(kind, key) for kind, key in store.artifacts() if kind == "metrics"]
    rates = [r["value"] for ref in refs for r in store.read_rows(ref) if r["key"] == "centralized/parse_failure_rate"]
    assert rates and all(v == 1.0 for v in rates)
    assert t["reward_first"] == t["reward_last"] == 0.0


def test_centralized_run_learns(tmp_path):
    """The joint actor learns the length that gives its fixed-width roles a 2-3x ratio (measured gains +0.62,
    +0.72, +0.55 on seeds 0-2)."""
    gains = []
    for seed in LEARNING_SEEDS:
        d = tmp_path / f"s{seed}"
        data = centralized(d, num_train_epochs=2, num_generations=4, max_new_tokens=48, rollout_buffer_size=1)
        data.update(seed=seed, taskset={"name": "story-length-ratio", "num_items": 16, "num_eval_items": 4})
        s = run_inline(validate_config(data))
        gains.append(s["reward_last"] - s["reward_first"])
    assert_learns(gains, 0.3)


# --- the loss ----------------------------------------------------------------------------------------


def test_loss_is_the_full_joint_sequence_policy_gradient(tiny_model_dir):
    """−mean_k(sum of log π over every joint token, EOS included) x A_k, and its gradient."""
    from coopflow.stages.agents.models import load_agent
    from coopflow.stages.update.policy_gradient import policy_loss

    torch.manual_seed(0)
    model, tok = load_agent(str(tiny_model_dir), "float32", "sdpa")
    prompt = tok.encode("joint prompt of two roles")
    eos = tok.eos_token_id
    comps = [tok.encode("a short one")[:3] + [eos], tok.encode("a rather longer joint answer")[:6] + [eos]]
    adv = [1.0, -1.0]
    node = [{"prompt_ids": prompt, "completion_ids": c, "advantage": a} for c, a in zip(comps, adv)]
    manual = []
    for c, a in zip(comps, adv):
        ids = torch.tensor([prompt + c])
        logits = model(ids, use_cache=False).logits[0, len(prompt) - 1:-1]
        manual.append(-logits.log_softmax(-1).gather(1, torch.tensor(c)[:, None]).sum() * a)
    expected = torch.stack(manual).mean()
    expected.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    actual, ntok = policy_loss(model, [node], tok.pad_token_id, pad_tail=False)
    actual.backward()
    torch.testing.assert_close(actual, expected)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    assert ntok == sum(len(c) for c in comps)  # every joint token, the EOS included


# --- preference learning -------------------------------------------------------------------------------


def _pref(tmp, algorithm, adapter="tests.helpers:FixedSplitAdapter", **trainer):
    cfg = small_config(tmp, centralized_adapter=adapter)
    cfg["trainer"] = {"agent_learning_rate": 1e-3, "max_new_tokens": 16, "temperature": 1.0,
                      "preference_num_candidates": 4, "train_batch_size": 4, "eval_num_samples": 2, **trainer}
    return validate_config(cfg, algorithm)


@pytest.mark.parametrize("algorithm, extra", [("madpo", {"num_train_epochs": 1}),
                                              ("marlhf", {"num_train_epochs": 1, "reward_num_train_epochs": 1})])
def test_centralized_madpo_and_marlhf_train_one_joint_actor(tmp_path, algorithm, extra):
    from coopflow.flows.driver import run_inline

    out = run_inline(_pref(tmp_path, algorithm, collaboration_mode="centralized", **extra))
    lay = CheckpointLayout(Path(out["checkpoint"]))
    assert lay.agent(0).is_dir() and not lay.agent(1).exists()
    store = ArtifactStore(tmp_path / "artifacts")
    cand = store.read_rows(store.find("rollouts", out["candidates"]))
    assert {r["agent"] for r in cand} == {0} and all(" | " in r["prompt"] for r in cand)  # the joint prompt
    assert "eval/turn_1/reward_mean" in out["eval"]


def test_centralized_iterative_round_compares_joint_completions(tmp_path):
    from coopflow.stages.loops.rounds import run_rounds
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.stages.planning.context import make_context

    cfg = _pref(tmp_path, "madpo-iter", collaboration_mode="centralized", num_iterations=1)
    assert cfg.trainer.comparator_generation_mode == "centralized"  # forced, as in the reference
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    out = run_rounds(ctx)
    shard = store.read_rows(out[-1]["shard"])
    assert shard and {r["agent"] for r in shard} == {0}
    assert CheckpointLayout(store.open_dir(out[-1]["checkpoint"])).agent(0).is_dir()
    with pytest.raises(ConfigError, match="must be 0"):
        _pref(tmp_path, "madpo-iter", collaboration_mode="centralized", comparator_centralized_agent_index=1)


@pytest.mark.parametrize("mode", ["centralized", "centralized_sequential"])
def test_coordinator_comparator_writes_every_role(tmp_path, mode):
    """Decentralized agents, a coordinator comparator (agent index 1 of the comparator) writing all the roles."""
    from coopflow.stages.loops import rounds as I
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.loops.segment import acquire_policies
    from coopflow.stages.tasks.taskset import build_taskset

    cfg = _pref(tmp_path, "madpo-iter", adapter=None, comparator_generation_mode=mode,
                comparator_centralized_agent_index=1, num_agents=2)
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    pol = acquire_policies(ctx, None, ctx.plan.start_key)
    rows = I.coordinated_rows(ctx, pol, 3, seed=5)
    items = ctx.train_items
    assert len(rows) == len(items) * 2 * 3
    assert {(r["item_id"], r["agent"], r["sample"]) for r in rows} == {(it["_item_id"], a, s) for it in items
                                                                       for a in range(2) for s in range(3)}
    if mode == "centralized":  # random tiny model: no <agent_i> sections, so every role is "" (a parse failure)
        assert all(r["completion_text"] == "" for r in rows)
    else:  # a sequential completion without tags is the role's text itself
        assert any(r["completion_text"] for r in rows)
    with pytest.raises(ConfigError, match="below num_agents"):
        _pref(tmp_path, "madpo-iter", comparator_generation_mode="centralized", comparator_centralized_agent_index=2,
              num_agents=2)


def test_delimited_adapter_for_small_models():
    from coopflow.stages.tasks.centralized import DelimitedAdapter

    a = DelimitedAdapter()
    prompt = a.build_prompt({}, ["short task", "long task", "third task"])
    assert "Task 1:\nshort task" in prompt and "Task 3:\nthird task" in prompt and "blank line" in prompt
    assert a.parse_completion("a\n\n\n\nb\n\nc", {}, 2) == ["a", "b\n\nc"]  # empty parts skipped, extras to the last
    assert a.parse_completion("only one", {}, 3) == ["only one", "", ""]  # missing parts are ""
    with pytest.raises(CentralizedComparatorParseError):
        a.parse_completion("  \n\n ", {}, 2)
    assert DelimitedAdapter(" | ").parse_completion("x | y", {}, 2) == ["x", "y"]


def test_cli_refuses_a_missing_adapter_before_prefect_starts():
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "validate", "--config", "configs/magrpo-story.yaml",
                        "--set", "trainer.collaboration_mode=centralized", "--set",
                        "centralized_adapter=coopflow.centralized:NoSuchAdapter"],
                       cwd=repo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "centralized_adapter" in r.stderr and "NoSuchAdapter" in r.stderr, r.stderr
