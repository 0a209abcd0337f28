"""Preference learning: MADPO and MARLHF as chains of stages over Parquet artifacts.

MADPO in plain words: sample many joint answers per task, score them with the task reward, turn
every better/worse pair into a preference, and push each agent to make the better joint answer
more likely than the worse one (DPO, factorized over agents, no reference model).
MARLHF: fit a joint reward model on those preferences, freeze it, and run online multi-agent RL
(the MAGRPO family or IAC/MAAC) with it as the reward; evaluation always uses the task reward.

    taskset → candidates (rollouts + scores) → pairs → DPO update            → evaluate   (MADPO)
                                               pairs → fit reward model → RL → evaluate   (MARLHF)

Keys (input-addressed, so changing a later setting reuses everything before it):

    candidates = H(initial policy, items, sampling with P candidates, formatters, seed)
    scores     = H(candidates, task reward)
    pairs      = H(scores, pair_selection, pairs_per_sample, seed)
    policy     = H(initial policy, pairs, dpo_beta, lr, epochs, batch, seed)             (MADPO)
    rm         = H(pairs, backbone, reward lr/epochs/batch/max_length/freeze, seed)     (MARLHF)
"""

import random
import time
from collections import defaultdict

from coopflow.artifacts import ArtifactRef
from coopflow.stages.agents.models import save_checkpoint
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.evaluate.evaluate import evaluate
from coopflow.stages.planning.context import RunContext, formatters_for, resolve_model_sources, rl_phase_context
from coopflow.stages.planning.keys import (candidates_key, dpo_key, metrics_key, pairs_key, preference_scores_key,
                                           reward_model_key)
from coopflow.stages.loops.segment import acquire_policies
from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts
from coopflow.stages.score.pairs import build_pairs
from coopflow.stages.score.scores import score_rewards

# --- candidates, scores, pairs -------------------------------------------------------------------


def generate_candidates(ctx: RunContext) -> tuple[ArtifactRef, ArtifactRef]:
    """P aligned joint candidates per training item and their task-reward scores (cached by key)."""
    store = ctx.store
    ref, sref = store.find("rollouts", candidates_key(ctx)), store.find("scores", preference_scores_key(ctx))
    if ref is None:
        s = ctx.settings.candidates
        pol = acquire_policies(ctx, None, ctx.plan.start_key, ctx.settings.dpo)  # the policies DPO then trains
        fmts = formatters_for(ctx, pol, s)
        prompts = [[f(it) for it in ctx.train_items] for f in fmts]
        sampling = SamplingConfig.of(s, ctx.settings.execution, s.trainer.preference_num_candidates)
        rows = generate_rollouts(pol, prompts, [it["_item_id"] for it in ctx.train_items], sampling, s.seed, step=0)
        ctx.session.live.put(ctx.plan.start_key, pol)  # the initial policy stays live for the DPO update
        ctx.session.calls["generate"] += 1
        ref = store.put_table("rollouts", candidates_key(ctx), rows)
    if sref is None:
        rows = store.read_rows(ref)
        by_id = {it["_item_id"]: it for it in ctx.train_items}
        scores = score_rewards(rows, by_id, ctx.caller, ctx.processor, "aligned", 0)
        ctx.session.calls["score"] += 1
        sref = store.put_table("scores", preference_scores_key(ctx), scores)
    return ref, sref


def make_pairs(ctx: RunContext, cand: ArtifactRef, scores: ArtifactRef) -> ArtifactRef:
    """The pairs artifact (rebuilt from the stored candidates and scores when the selection changes)."""
    found = ctx.store.find("pairs", pairs_key(ctx))
    if found is not None:
        return found
    s = ctx.settings.pairs
    rows = build_pairs(ctx.store.read_rows(cand), ctx.store.read_rows(scores), s.trainer.pair_selection,
                       s.trainer.preference_pairs_per_sample, s.seed)
    ctx.session.calls["pairs"] += 1
    return ctx.store.put_table("pairs", pairs_key(ctx), rows)


class NoPairs(ValueError):
    """Every candidate set was tied: there is nothing to learn from."""


def pairs_by_id(rows: list[dict]) -> dict[int, dict[int, dict]]:
    """{pair_id: {agent: row}}; raises NoPairs with a clear message when there are none."""
    out: dict[int, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        out[r["pair_id"]][r["agent"]] = r
    if not out:
        raise NoPairs("no preference pairs: every item's candidates tied on the task reward (all rewards equal). "
                      "Raise preference_num_candidates or temperature, or use a reward that separates the candidates")
    return dict(out)


# --- MADPO: DPO training -------------------------------------------------------------------------


def train_dpo(ctx: RunContext, pairs: ArtifactRef, show_progress: bool = False) -> dict:
    """DPO over the pairs: `num_train_epochs` seeded-shuffled passes in batches of train_batch_size pairs.

    Returns {"checkpoint", "metrics", "steps", "cached"} refs (the metrics rows hold the curve)."""
    from coopflow.stages.update.dpo import dpo_update

    store, s, ms = ctx.store, ctx.settings.dpo, ctx.settings.dpo_metrics  # the update's and the metric rows' settings
    t, mt = s.trainer, ms.trainer
    key = dpo_key(ctx)
    mkey = metrics_key(ctx, key)
    done = [store.find("checkpoint", key), store.find("metrics", mkey), store.find("steps", key)]
    if all(done):
        return {"checkpoint": done[0], "metrics": done[1], "steps": done[2], "cached": True}
    by_id = pairs_by_id(store.read_rows(pairs))
    pol = acquire_policies(ctx, None, ctx.plan.start_key, s)
    fmts = formatters_for(ctx, pol, ms)
    sampling = SamplingConfig.of(ms, ctx.settings.execution, 1)  # periodic evaluations: one joint answer per item
    ids = sorted(by_id)
    rng = random.Random(derive_seed(s.seed, "dpo-shuffle"))
    env, updates, metric_rows, steps_rows, last = 0, 0, [], [], None
    t0 = time.perf_counter()
    try:
        for epoch in range(t.num_train_epochs):
            rng.shuffle(ids)
            for b in range(0, len(ids), t.batch_size):
                if mt.eval_interval and mt.eval_num_samples and updates % mt.eval_interval == 0:
                    ecaller, eproc, _ = ctx.eval_reward()
                    _, em = evaluate(pol, ctx.eval_items_used(), fmts, sampling, ecaller, eproc,
                                     derive_seed(s.seed, "eval", updates), ctx.episode, ctx.eval_hooks,
                                     samples=mt.eval_samples_per_item)
                    ctx.session.calls["evaluate"] += 1
                    metric_rows += [{"key": k, "value": v, "env_step": env} for k, v in em.items()]
                chunk = ids[b:b + t.batch_size]
                batch = {a: [by_id[p][a] for p in chunk] for a in range(ctx.n)}
                m = dpo_update(pol, batch, t.dpo_beta)
                ctx.session.calls["update"] += 1
                updates += 1
                if t.use_environment_step:
                    env += t.environment_steps_per_pair * len(chunk)
                reward_mean = sum(by_id[p][0]["candidate_reward_mean"] for p in chunk) / len(chunk)
                if last is None or env - last >= mt.logging_steps:
                    last = env
                    m.update({"turn_1/reward_mean": reward_mean, "turn_1/expected_return": reward_mean})
                    metric_rows += [{"key": k, "value": v, "env_step": env} for k, v in m.items()]
                steps_rows.append({"update": updates - 1, "epoch": epoch, "env_step": env, "rollouts": "",
                                   "scores": "", "signal": pairs.key, "signal_kind": "pairs",
                                   "reward_mean": reward_mean})
    except BaseException:
        ctx.session.live.clear()
        raise
    metric_rows.append({"key": "timing/train_s", "value": time.perf_counter() - t0, "env_step": env})
    state = {"update": updates, "env_step": env, "algorithm": "madpo"}
    pol.state = state
    ckpt = store.put_dir("checkpoint", key, lambda d: save_checkpoint(pol, d, state))
    ctx.session.live.put(key, pol)
    return {"checkpoint": ckpt, "metrics": store.put_table("metrics", mkey, metric_rows),
            "steps": store.find("steps", key) or store.put_table("steps", key, steps_rows), "cached": False}


# --- MARLHF: reward model, then online RL on it --------------------------------------------------


def rm_source(settings) -> str:
    """The reward model's backbone: trainer.reward_model_name, else the first agent's model."""
    return settings.trainer.reward_model_name or settings.agents.sources()[0]


def rm_key(ctx: RunContext) -> str:
    """Key of the reward model fitted on this run's pairs (`keys.reward_model_key` with its backbone's identity)."""
    src = rm_source(ctx.settings.reward_model)
    _, ident = resolve_model_sources([src], ctx.settings, ctx.store, "trainer.reward_model_name")
    return reward_model_key(ctx, ident)


def fit_rm(ctx: RunContext, pairs: ArtifactRef, key: str | None = None) -> tuple[ArtifactRef, dict[str, float]]:
    """The fitted joint reward model (a `reward_model` dir artifact, stored under `key`, default rm_key) and
    its accuracy/margin on the pairs. The model starts fresh from the backbone (trainer.reward_model_name)."""
    from coopflow.stages.fit.reward_model import fit_reward_model, load_reward_model, pair_texts, rank_metrics

    s, store = ctx.settings.reward_model, ctx.store
    t = s.trainer
    texts = pair_texts(store.read_rows(pairs))
    pairs_by_id(store.read_rows(pairs))  # clear error when there are no pairs
    key = key or rm_key(ctx)
    device = ctx.settings.execution.trainer.reward_model_device or s.agents.device
    found = store.find("reward_model", key)
    if found is not None:
        rm = load_reward_model(store.open_dir(found), s.agents.dtype, device, t.reward_freeze_backbone,
                               t.reward_max_length)
        return found, rank_metrics(rm, texts)
    paths, _ = resolve_model_sources([rm_source(s)], ctx.settings, store, "trainer.reward_model_name")
    rm = load_reward_model(paths[0], s.agents.dtype, device, t.reward_freeze_backbone, t.reward_max_length,
                           derive_seed(s.seed, "reward_head") % (2 ** 31))
    before = rank_metrics(rm, texts)
    steps = fit_reward_model(rm, texts, t.reward_learning_rate, t.reward_num_train_epochs,
                             t.reward_train_batch_size, derive_seed(s.seed, "rm-shuffle"))
    ctx.session.calls["fit_reward_model"] += 1
    metrics = {**rank_metrics(rm, texts), "reward_model/accuracy_before": before["reward_model/accuracy"],
               "reward_model/loss_last": steps[-1]["loss"] if steps else float("nan")}
    return store.put_dir("reward_model", key, rm.save), metrics


def load_rm_reward(ctx: RunContext, rm_ref: ArtifactRef):
    """The frozen reward model of `rm_ref` as a reward function over the agents' joint answers."""
    from coopflow.stages.fit.reward_model import RewardModelReward, load_reward_model

    s = ctx.settings.reward_model
    rm = load_reward_model(ctx.store.open_dir(rm_ref), s.agents.dtype,
                           ctx.settings.execution.trainer.reward_model_device or s.agents.device,
                           s.trainer.reward_freeze_backbone, s.trainer.reward_max_length)
    rm.requires_grad_(False)
    return RewardModelReward(rm, formatters_for(ctx, None, s))  # centralized: the joint prompt (no chat template)


def rl_context(ctx: RunContext, rm_ref: ArtifactRef, sources: list[str] | None = None,
               source_ident: dict | None = None) -> RunContext:
    """A RunContext for the RL phase whose training reward is the frozen reward model (starting from
    `sources`, default the run's agents; `source_ident` names them in the keys)."""
    return rl_phase_context(ctx, (load_rm_reward(ctx, rm_ref), {"reward_model": rm_ref.key}), sources, source_ident)
