"""Actor-critic (IAC / MAAC): value heads and readouts, TD targets, clipping, rewards, configs, save/load."""

import pytest
import torch

from coopflow.schemas.config import ConfigError, validate_config
from coopflow.artifacts import ArtifactStore
from coopflow.stages.planning.context import make_context
from coopflow.stages.planning.keys import segment_record_keys
from coopflow.stages.loops.run import refit_critic
from coopflow.stages.loops.segment import peek_policies, train_segment
from coopflow.stages.score.ac_targets import compute_targets, expand_rewards
from coopflow.stages.fit.critic import value_error
from coopflow.stages.agents.models import load_agent
from coopflow.stages.update.actor_critic import update_actor
from coopflow.stages.agents.value_heads import ValueHead, forward_values, joint_critic_text, new_head
from tests.conftest import small_config
from tests.helpers import LEARNING_SEEDS, assert_learns


# --- value head and readouts ---------------------------------------------------------------------


def test_value_head_shape_and_init():
    torch.manual_seed(0)
    head = ValueHead(512)
    lin1, act, lin2 = head.net
    assert isinstance(act, torch.nn.Tanh) and lin1.out_features == 512 and lin2.out_features == 1
    assert torch.all(lin1.bias == 0) and torch.all(lin2.bias == 0)
    assert abs(lin1.weight.std().item() - 0.02) < 0.002 and abs(lin1.weight.mean().item()) < 0.002
    assert ValueHead(64, 16).net[0].out_features == 16
    assert head(torch.zeros(3, 7, 512)).shape == (3, 7)


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    model, tok = load_agent(tiny_model_dir)
    torch.manual_seed(1)
    return model, tok, new_head(model)


def _alone(model, head, ids: list[int]) -> float:
    h = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state
    return head(h[0, -1]).item()


def test_batched_v_and_q_readouts_match_single_sequence_forwards(lm):
    model, tok, head = lm
    prompts = [tok("tell a story")["input_ids"], tok("a much longer prompt about the moon and stars")["input_ids"]]
    comps = [tok(" once upon")["input_ids"], tok(" the moon")["input_ids"] + [tok.eos_token_id]]
    with torch.no_grad():
        v = forward_values(model, head, prompts, comps, tok.pad_token_id, "v")
        q, logp = forward_values(model, head, prompts, comps, tok.pad_token_id, "q", with_logprobs=True)
        from coopflow.stages.agents.logprobs import sequence_logprobs

        ref_logp = sequence_logprobs(model, prompts, comps, tok.pad_token_id)
    for b in range(2):  # V: last prompt token of the prompt alone; Q: last token of prompt + completion
        assert v[b].item() == pytest.approx(_alone(model, head, prompts[b]), abs=1e-5)
        assert q[b].item() == pytest.approx(_alone(model, head, prompts[b] + comps[b]), abs=1e-5)
    assert torch.allclose(logp, ref_logp, atol=1e-4)  # the shared-head forward gives the same log-probs


def test_joint_critic_text_format():
    assert joint_critic_text(["p0", "p1"]) == "[Agent 0] p0\n\n[Agent 1] p1"
    assert joint_critic_text(["p0", "p1"], ["a", "b"]) == (
        "[Agent 0] p0\n\n[Agent 1] p1\n\n[Joint Action]\n\n[Agent 0 action]\na\n\n[Agent 1 action]\nb")


# --- rewards, targets, advantages, clipping ------------------------------------------------------


def test_reward_expansion_rules():
    assert expand_rewards([0.5], 2, 3) == [[0.5] * 3, [0.5] * 3]
    assert expand_rewards([1, 2, 3], 2, 3) == [[1, 2, 3], [1, 2, 3]]  # K values: one per sample index
    assert expand_rewards([1, 2], 2, 3) == [[1, 1, 1], [2, 2, 2]]  # N values: one per agent
    assert expand_rewards([1, 2], 2, 2) == [[1, 2], [1, 2]]  # N == K: read as per sample (reference order)
    with pytest.raises(ValueError, match="must return 1, num_generations"):
        expand_rewards([1, 2, 3, 4], 2, 3)


def _s(turn, reward, old_value, agent=0, kl=0.0, item=0, sample=0):
    return {"step": 0, "item_id": item, "turn": turn, "node_id": turn, "agent": agent, "sample": sample,
            "reward": reward, "ref_kl": kl, "old_value": old_value}


def test_td0_targets_mc_returns_and_kl_shaping_by_hand():
    traj = [_s(0, 1.0, 0.2, kl=0.2), _s(1, 0.5, 0.4)]
    compute_targets(traj, discount=0.9, kl_coef=0.5, normalize=False)
    # r' = [1 - 0.5*0.2, 0.5] = [0.9, 0.5]; target_0 = 0.9 + 0.9*V_old(h_1) = 0.9 + 0.36; target_1 = r'_1
    assert [s["shaped_reward"] for s in traj] == pytest.approx([0.9, 0.5])
    assert [s["value_target"] for s in traj] == pytest.approx([1.26, 0.5])
    assert [s["mc_return"] for s in traj] == pytest.approx([0.9 + 0.9 * 0.5, 0.5])
    assert [s["advantage"] for s in traj] == pytest.approx([1.26 - 0.2, 0.5 - 0.4])
    assert [s["norm_advantage"] for s in traj] == pytest.approx([1.06, 0.1])  # groups of one: no z-norm


def test_advantages_normalize_over_each_agent_turn_group():
    group = [_s(0, r, 0.0, item=i) for i, r in enumerate([1.0, 2.0, 3.0])] + [_s(0, 5.0, 1.0, agent=1)]
    compute_targets(group, discount=0.9, kl_coef=None, normalize=True)
    z = (torch.tensor([1.0, 2.0, 3.0]) - 2.0) / torch.tensor([1.0, 2.0, 3.0]).std(unbiased=False)
    assert [s["norm_advantage"] for s in group[:3]] == pytest.approx(z.tolist())
    assert group[3]["norm_advantage"] == pytest.approx(4.0)  # alone in its group: unchanged


def test_value_clipping_math():
    V, y, old = torch.tensor([1.0, 0.3]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    assert value_error(V, y).tolist() == pytest.approx([1.0, 0.49])
    # clip 0.1: V_clip = old + clip(V - old, ±0.1) = [0.6, 0.4]; max((y-V)^2, (y-V_clip)^2)
    assert value_error(V, y, old, 0.1).tolist() == pytest.approx([max(1.0, 0.36), max(0.49, 0.36)])
    assert value_error(torch.tensor([0.55]), torch.tensor([1.0]), torch.tensor([0.5]), 0.1).item() == \
        pytest.approx(max(0.45 ** 2, 0.45 ** 2))


def test_non_finite_advantage_raises(lm):
    model, tok, head = lm
    from coopflow.stages.agents.state import AgentState

    agent = AgentState(model, tok, 1e-3, value_head=head)
    s = {"step": 0, "turn": 0, "node_id": 0, "sample": 0, "prompt_ids": [5, 6], "completion_ids": [7],
         "norm_advantage": float("nan"), "value_target": 1.0, "old_value": 0.0}
    with pytest.raises(FloatingPointError, match="advantage"):
        update_actor(agent, [s], 1, 0, 0, 0)


# --- configs: critic sources and reference rules -------------------------------------------------


def _cfg(tmp_path, **over):
    cfg = small_config(tmp_path, critic={"critic_model": "tiny"})
    cfg["trainer"] = {"num_train_epochs": 1, "agent_learning_rate": 1e-3, "max_new_tokens": 8, "num_turns": 1,
                      "rollout_buffer_size": 2, "eval_interval": 0, "eval_num_samples": 2, "temperature": 1.0}
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        elif isinstance(v, dict):
            cfg[k] = {**cfg.get(k, {}), **v}
        else:
            cfg[k] = v
    return cfg


@pytest.mark.parametrize("algo, over, msg", [
    ("iac", {"critic": None}, "critics must be provided"),
    ("iac", {"trainer": {"use_separate_critic": False}}, "only be provided when trainer.use_separate_critic"),
    ("iac", {"critic": {"critic_model": None, "critics": ["tiny"]}}, "critic.critics length 1 must equal num_agents 2"),
    ("maac", {"critic": {"critic_model": None, "critics": ["tiny", "tiny"]}}, "exactly one critic"),
    ("maac", {"critic": None}, "critics must be provided"),
    ("iac", {"trainer": {"num_turns": 2, "num_generations": 2}, "transition": {"name": "plain"}},
     "requires num_generations == 1"),
    ("iac", {"trainer": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}}, "requires critic_devices"),
    ("maac", {"trainer": {"parallel_training": "auto"}}, "parallel_training must be"),
])
def test_actor_critic_config_errors(tmp_path, algo, over, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_config(_cfg(tmp_path, **over), algo)


def test_actor_critic_defaults_match_the_reference(tmp_path):
    c = validate_config({"critic": {"critic_model": "tiny"}, "trainer": {"num_turns": 1}}, "maac").trainer
    assert (c.rollout_buffer_size, c.value_loss_coef, c.discount, c.num_generations, c.top_k, c.num_train_epochs,
            c.critic_type, c.logging_steps, c.critic_learning_rate) == (8, 0.6, 1.0, 1, None, 40, "v", 1, 5e-6)
    i = validate_config({"critic": {"critic_model": "tiny"}, "trainer": {"num_turns": 1}}, "iac").trainer
    assert (i.use_separate_critic, i.value_clip_range) == (True, 0.2)


# --- end to end: layout, reruns, save/load round trip ---------------------------------------------


def _weights(pol) -> dict[str, torch.Tensor]:
    out = {}
    for i, a in enumerate(pol.agents):
        out.update({f"a{i}.{k}": v.clone() for k, v in a.model.state_dict().items()})
        if a.critic is not None:
            out.update({f"c{i}.{k}": v.clone() for k, v in a.critic.model.state_dict().items()})
            out.update({f"c{i}.head.{k}": v.clone() for k, v in a.critic.head.state_dict().items()})
        if a.value_head is not None:
            out.update({f"h{i}.{k}": v.clone() for k, v in a.value_head.state_dict().items()})
    if pol.critic is not None:
        out.update({f"C.{k}": v.clone() for k, v in pol.critic.model.state_dict().items()})
        out.update({f"C.head.{k}": v.clone() for k, v in pol.critic.head.state_dict().items()})
    return out


@pytest.mark.parametrize("algo, over, files", [
    ("iac", {}, ["agent_0/critic/value_head.pt", "agent_1/critic/model.safetensors", "optimizer/critic_1.pt"]),
    ("iac", {"trainer": {"use_separate_critic": False}, "critic": None}, ["agent_0/value_head.pt"]),
    ("maac", {"trainer": {"critic_type": "q"}}, ["critic/value_head.pt", "optimizer/critic.pt"]),
])
def test_checkpoints_reload_and_continue_like_an_uninterrupted_run(tmp_path, algo, over, files):
    from coopflow.stages.tasks.taskset import build_taskset

    def run(data, reload_between: bool):
        cfg = validate_config(_cfg(data, checkpoint_every=1, **over), algo)
        store = ArtifactStore(data / "artifacts")
        ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
        ckpt, key = None, ctx.plan.start_key
        for i in range(len(ctx.plan.segments)):
            if reload_between:
                ctx.session.close()  # the next segment loads the checkpoint from disk (weights, heads, optimizers)
            res = train_segment(ctx, i, ckpt, key)
            ckpt, key = res.checkpoint, res.checkpoint.key
        return store.open_dir(ckpt), peek_policies(ctx, ckpt)

    d1, pol1 = run(tmp_path / "a", False)
    for f in files:
        assert (d1 / f).is_file(), f
    w1 = _weights(pol1)
    _, pol2 = run(tmp_path / "b", True)
    w2 = _weights(pol2)
    assert w1.keys() == w2.keys()
    bad = [k for k in w1 if not torch.equal(w1[k], w2[k])]
    assert not bad, bad[:5]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_actor_critic_learns_the_length_ratio_task(tmp_path, algo):
    """The shipped IAC / MAAC configs over seeds 0-2: the shared length-ratio reward rises on the tiny model
    (measured gains over seeds 0-4: IAC +0.33 … +0.52, MAAC +0.23 … +0.55; eval 0.65 … 0.98)."""
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    gains, evals = [], []
    for seed in LEARNING_SEEDS:
        cfg = load_config(f"configs/{algo}-story.yaml", [f"data_dir={tmp_path / str(seed)}", f"seed={seed}"],
                          algorithm=algo)
        s = run_inline(cfg)
        gains.append(s["reward_last"] - s["reward_first"])
        evals.append(s["eval"]["eval/turn_1/reward_mean"])
    assert_learns(gains, 0.2)
    assert sum(evals) / len(evals) > 0.6, evals


def test_metrics_callback_domain_metrics_are_logged_per_update(tmp_path):
    from coopflow.stages.tasks.taskset import build_taskset

    cfg = validate_config(_cfg(tmp_path, metrics_callback="tests.helpers:char_length_metrics"), "maac")
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    res = train_segment(ctx, 0, None, ctx.plan.start_key)
    rows = [r for r in store.read_rows(res.metrics) if r["key"] in ("response_char_length_mean", "samples_seen")]
    assert [r["env_step"] for r in rows if r["key"] == "samples_seen"] == [2, 4]  # one per update (2 items each)
    assert all(r["value"] == 4.0 for r in rows if r["key"] == "samples_seen")  # 2 items x 2 agents x K=1


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_refit_critic_from_stored_samples_lowers_value_loss_without_generating(tmp_path, algo):
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.flows.driver import run_inline

    cfg = validate_config(_cfg(tmp_path, critic={"critic_model": "tiny", "refit_epochs": 8,
                                                 "refit_learning_rate": 3e-3}), algo)
    run_inline(cfg)
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    ends = list(ctx.end_keys)
    before = dict(ctx.session.calls)
    steps = [store.find("steps", segment_record_keys(ctx, i)[0]) for i in range(len(ends))]
    ref, m = refit_critic(ctx, store.find("checkpoint", ends[-1]), steps)
    calls = ctx.session.calls
    assert calls["generate"] == before.get("generate", 0) and calls["fit_critic"] == before.get("fit_critic", 0) + 1
    assert m["critic_refit/value_loss_after"] < m["critic_refit/value_loss_before"]
    names = ["critic"] if algo == "maac" else ["agent_0", "agent_1"]
    assert all((store.open_dir(ref) / n / "value_head.pt").is_file() for n in names)
    again, m2 = refit_critic(ctx, store.find("checkpoint", ends[-1]), steps)
    assert again.key == ref.key and calls["fit_critic"] == before.get("fit_critic", 0) + 1  # cached: not refit
    assert m2["critic_refit/value_loss_after"] == pytest.approx(m["critic_refit/value_loss_after"], abs=1e-5)


@pytest.mark.parametrize("algo, devices", [("iac", {"critic_devices": ["cpu", "cpu"]}), ("maac", {"critic_devices": "cpu"})])
def test_mp_workers_match_in_process_actor_critic(tmp_path, algo, devices, pinned_threads):
    """IAC critics live in the agents' worker processes, MAAC's critic in the main one: same results as in-process."""
    from safetensors.torch import load_file

    from coopflow.flows.driver import run_inline

    local = run_inline(validate_config(_cfg(tmp_path / "local"), algo))
    par = run_inline(validate_config(_cfg(tmp_path / "mp", trainer={"parallel_training": "mp",
                                                                      "agent_devices": ["cpu", "cpu"], **devices}), algo))
    assert par["reward_last"] == local["reward_last"] and par["eval"] == local["eval"]
    sub = "agent_1/critic" if algo == "iac" else "critic"
    for d in ("agent_1", sub):
        wl = load_file(f"{local['checkpoint']}/{d}/model.safetensors")
        wp = load_file(f"{par['checkpoint']}/{d}/model.safetensors")
        assert all(torch.allclose(wl[k], wp[k], atol=1e-5) for k in wl), d


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_multi_turn_actor_critic_with_reference_kl_runs_td_targets_over_turns(tmp_path, algo):
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.flows.driver import run_inline

    cfg = validate_config(_cfg(tmp_path, transition={"name": "plain"},
                               trainer={"num_turns": 2, "early_termination_threshold": None,
                                        "reference_kl_enabled": True, "reference_kl_coef": 0.5}), algo)
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 2 and set(s["eval"]) >= {"eval/turn_2/reward_mean"}
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    steps = store.read_rows(store.find("steps", segment_record_keys(ctx, len(ctx.end_keys) - 1)[0]))
    ac = [r for st in steps for r in store.read_rows(store.find(st["signal_kind"], st["signal"]))]
    by = {(r["item_id"], r["agent"], r["turn"]): r for r in ac}
    for (item, agent, turn), r in by.items():
        assert r["shaped_reward"] == pytest.approx(r["reward"] - 0.5 * r["ref_kl"])
        if turn == 0:  # TD(0) onto the next turn's old value; the MC return adds gamma * G_1
            nxt = by[(item, agent, 1)]
            g = cfg.trainer.discount  # 1.0, CoMLRL 1.4.3's default
            assert r["value_target"] == pytest.approx(r["shaped_reward"] + g * nxt["old_value"])
            assert r["mc_return"] == pytest.approx(r["shaped_reward"] + g * nxt["mc_return"])
        else:
            assert r["value_target"] == pytest.approx(r["shaped_reward"])
    assert any(r["ref_kl"] > 0 for r in ac)  # the policy moved away from its frozen reference after update 1
    last = segment_record_keys(ctx, len(ctx.end_keys) - 1)
    keys = {r["key"] for r in store.read_rows(store.find("metrics", last[1]))}
    assert {"turn_2/value_loss", "turn_2/reference_kl_mean", "turn_1/expected_return"} <= keys


def test_iac_critic_can_be_a_different_model_with_its_own_vocabulary(tmp_path):
    from coopflow.stages.tasks.taskset import build_taskset
    from coopflow.stages.agents.models import build_tiny_model

    other = build_tiny_model(tmp_path / "critic-model", hidden_size=48, num_layers=1, vocab_size=320)
    cfg = validate_config(_cfg(tmp_path, critic={"critic_model": str(other)}), "iac")
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    res = train_segment(ctx, 0, None, ctx.plan.start_key)
    pol = ctx.session.live.policies
    assert pol.agents[0].critic.same_vocab is False  # the critic re-tokenizes the texts with its own tokenizer
    assert pol.agents[0].critic.model.config.hidden_size == 48
    rows = [r for r in store.read_rows(res.metrics) if r["key"] == "turn_1/value_loss"]
    assert rows and all(r["value"] == r["value"] for r in rows)  # finite
