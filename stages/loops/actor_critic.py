"""Actor-critic (IAC / MAAC): the update strategy the segment loop uses for these algorithms.

IAC and MAAC in plain words: every agent samples answers, one shared reward scores the joint
answer, and a critic says how good the situation looked *before* the answer (V) or the answer
itself (Q). The advantage is "better than the critic expected": target − V_old, with target the
reward (single turn) or the TD(0) target r + γ·V_old(next turn). Each actor takes a REINFORCE step
weighted by its normalized advantage; the critic regresses onto the targets. IAC gives every agent
its own critic (a separate LM + head, or a head on the actor); MAAC has one centralized critic that
reads every agent's prompt (and action, for Q) and is updated with every agent's batch.

Per update, after the shared tree/rollout stage (`stages.rollout.tree`, with per-node reward calls):

    old values (critics, no grad) → targets/advantages (`stages.score.ac_targets`) → `ac_samples`
    → actors (+ own critics) step (`stages.update.actor_critic`) → MAAC: central critic steps
      (`stages.fit.critic`)
"""

from collections import defaultdict

from coopflow.stages.agents.checkpoint import CheckpointLayout
from coopflow.stages.agents.spec import AgentSpec, CriticSpec, ValueHeadSpec
from coopflow.stages.agents.value_heads import joint_critic_text
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.score.ac_targets import compute_targets
from coopflow.stages.fit.critic import critic_step, predict_values
from coopflow.stages.update.actor_critic import agent_values, minibatches, update_actor


def agent_specs(settings, execution, specs: list[AgentSpec], critic_paths: list[str] | None,
                checkpoint: CheckpointLayout | None = None) -> list[AgentSpec]:
    """The agents' specs with IAC's value head or separate critic (MAAC's critic is central, other algorithms
    have none); `settings`: the policy stage's settings, `execution`: where the critics run; `checkpoint`: where the
    separate critics' optimizer states are."""
    t = settings.trainer
    if settings.algorithm != "iac":
        return specs
    if not t.use_separate_critic:
        return [s.with_(value_head=ValueHeadSpec(t.value_head_hidden_dim, derive_seed(settings.seed, "value_head", i)))
                for i, s in enumerate(specs)]
    cdev = execution.trainer.critic_devices
    cdevs = [cdev] * len(specs) if isinstance(cdev, str) or cdev is None else list(cdev)
    if len(cdevs) == 1:
        cdevs = cdevs * len(specs)
    return [s.with_(critic=CriticSpec(critic_paths[i], t.critic_lr, t.critic_value_head_hidden_dim,
                                      cdevs[i] or s.device, derive_seed(settings.seed, "critic_head", i),
                                      str(checkpoint.agent_critic_optimizer(i)) if checkpoint is not None else None))
            for i, s in enumerate(specs)]


def _samples(rows: list[dict], scores: list[dict]) -> list[dict]:
    """One sample dict per rollout row, with its agent's expanded reward."""
    reward = {(s["step"], s["turn"], s["node_id"], s["joint_idx"]): s["agent_rewards"] for s in scores}
    out = []
    for r in rows:
        ar = reward[(r["step"], r["turn"], r["node_id"], r["sample"])]
        out.append({**r, "reward": ar[r["agent"]] if ar else 0.0})
    return out


def _joint_texts(rows: list[dict], critic_type: str) -> dict[tuple, str]:
    """MAAC critic input per (step, turn, node, sample): every agent's prompt (+ joint action for Q)."""
    prompts: dict[tuple, dict[int, str]] = defaultdict(dict)
    actions: dict[tuple, dict[int, str]] = defaultdict(dict)
    for r in rows:
        node = (r["step"], r["turn"], r["node_id"])
        prompts[node][r["agent"]] = r["prompt"]
        actions[node + (r["sample"],)][r["agent"]] = r["completion_text"]
    out = {}
    for key, acts in actions.items():
        ps = prompts[key[:3]]
        n = len(ps)
        out[key] = joint_critic_text([ps[a] for a in range(n)],
                                     [acts[a] for a in range(n)] if critic_type == "q" else None)
    return out


def old_values(ctx, pol, samples: list[dict]) -> None:
    """Fill `old_value` into every sample: own critics/heads per agent (IAC), the central critic (MAAC)."""
    s = ctx.settings.ac_samples
    t = s.trainer
    if s.algorithm == "maac":
        texts = _joint_texts(samples, t.critic_type)
        keys = sorted(texts)
        vals = dict(zip(keys, predict_values(pol.critic, [{"critic_text": texts[k]} for k in keys], t.critic_type)))
        for s in samples:
            s["critic_text"] = texts[(s["step"], s["turn"], s["node_id"], s["sample"])]
            s["old_value"] = vals[(s["step"], s["turn"], s["node_id"], s["sample"])]
        return
    per_agent = [[s for s in samples if s["agent"] == a] for a in range(ctx.n)]
    keep = ("prompt_ids", "completion_ids", "prompt", "completion_text")
    args = [([{k: s[k] for k in keep} for s in mine], t.critic_type) for mine in per_agent]
    for mine, vals in zip(per_agent, pol.run(agent_values, args)):
        for s, v in zip(mine, vals):
            s["old_value"] = v


AC_COLUMNS = ("step", "item_id", "turn", "node_id", "agent", "sample", "reward", "ref_kl", "shaped_reward",
              "old_value", "value_target", "mc_return", "advantage", "norm_advantage")


def build_samples(ctx, pol, rows: list[dict], scores: list[dict]) -> list[dict]:
    """Samples with rewards, old values, targets and advantages (the `ac_samples` rows + token data)."""
    t = ctx.settings.ac_samples.trainer
    samples = _samples(rows, scores)
    old_values(ctx, pol, samples)
    return compute_targets(samples, t.discount, t.reference_kl_coef if t.reference_kl_enabled else None,
                           t.advantage_normalization)


def join_samples(ctx, rows: list[dict], ac_rows: list[dict]) -> list[dict]:
    """Stored ac_samples rows joined back with their rollouts' token data (replay path)."""
    s = ctx.settings.ac_samples
    t = s.trainer
    key = ("step", "turn", "node_id", "agent", "sample")
    stored = {tuple(a[k] for k in key): a for a in ac_rows}
    out = [{**r, **stored[tuple(r[k] for k in key)]} for r in rows]
    if s.algorithm == "maac":
        texts = _joint_texts(rows, t.critic_type)
        for s in out:
            s["critic_text"] = texts[(s["step"], s["turn"], s["node_id"], s["sample"])]
    return out


def update(ctx, pol, samples: list[dict], seed: int, step: int) -> dict[str, float]:
    """Actors (+ own critics / heads) step on every agent's samples; MAAC's critic on every agent's batch."""
    s = ctx.settings.policy
    t = s.trainer
    keep = ("step", "turn", "node_id", "sample", "prompt_ids", "completion_ids", "prompt", "completion_text",
            "norm_advantage", "value_target", "old_value")
    clip = t.value_clip_range if s.algorithm == "iac" and not t.use_separate_critic else None
    per_agent = [[s for s in samples if s["agent"] == a] for a in range(ctx.n)]
    args = [([{k: s[k] for k in keep} for s in mine], t.batch_size, seed, step, a, t.critic_type, t.value_loss_coef,
             clip) for a, mine in enumerate(per_agent)]
    metrics: dict[str, float] = {}
    for m in pol.run(update_actor, args):
        metrics.update(m)
    if s.algorithm == "maac":  # the shared critic steps on every agent's minibatches, in agent order
        losses, preds = [], []
        for a, mine in enumerate(per_agent):
            for mb in minibatches(mine, t.batch_size, seed, step, a):
                m = critic_step(pol.critic, mb, t.critic_type, t.value_loss_coef)
                losses.append(m["value_loss"])
                preds.append(m["value_pred_mean"])
        metrics["critic/value_loss"] = sum(losses) / max(1, len(losses))
        metrics["critic/value_pred_mean"] = sum(preds) / max(1, len(preds))
    return metrics


def turn_metrics(samples: list[dict], update_metrics: dict[str, float], kl_coef: float | None) -> dict[str, float]:
    """Per turn t: reward_mean, expected_return (MC), value_pred_mean (V_old), value_target_mean,
    explained_variance, policy_loss / value_loss (means over agents), and the KL means when on."""
    out: dict[str, float] = {}
    pl = [v for k, v in update_metrics.items() if k.endswith("/policy_loss")]
    vl = [v for k, v in update_metrics.items() if k.endswith("value_loss")]
    for turn in sorted({s["turn"] for s in samples}):
        mine = [s for s in samples if s["turn"] == turn]
        p = f"turn_{turn + 1}/"
        n = len(mine)
        y = [s["value_target"] for s in mine]
        v = [s["old_value"] for s in mine]
        out[p + "reward_mean"] = sum(s["reward"] for s in mine) / n
        out[p + "expected_return"] = sum(s["mc_return"] for s in mine) / n
        out[p + "value_pred_mean"] = sum(v) / n
        out[p + "value_target_mean"] = sum(y) / n
        my = sum(y) / n
        var_y = sum((a - my) ** 2 for a in y) / n
        res = [a - b for a, b in zip(y, v)]
        mr = sum(res) / n
        var_r = sum((a - mr) ** 2 for a in res) / n
        out[p + "explained_variance"] = 1.0 - var_r / var_y if var_y > 0 else 0.0
        if pl:
            out[p + "policy_loss"] = sum(pl) / len(pl)
        if vl:
            out[p + "value_loss"] = sum(vl) / len(vl)
        if kl_coef is not None:
            kl = sum(s["ref_kl"] for s in mine) / n
            out[p + "reference_kl_mean"] = kl
            out[p + "reference_kl_penalty_mean"] = kl_coef * kl
    return out
