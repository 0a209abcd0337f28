"""Stage: actor-critic update — one AdamW step per minibatch for each actor (and its critic).

Per agent, the samples of one update are grouped by turn; each group is shuffled with a seeded RNG
and split into minibatches of `train_batch_size` samples. Per minibatch (as CoMLRL 1.4.3's `_ac_step`):

    policy_loss = mean_b( −log π(c_b | prompt_b) · Â_b )        (Â: normalized advantage, fixed)
    value_loss  = mean_b( (y_b − V_b)² )                         (clipped in IAC shared-head mode)

- IAC, separate critic: the actor steps on policy_loss, the agent's critic on coef·value_loss.
- IAC, shared head:     one backward of policy_loss + coef·value_loss; log-probs and values come
                        from the same forward; one optimizer over actor + head.
- MAAC:                 actors step on policy_loss here; the central critic steps in the main
                        process on every agent's minibatches (`fit_critic.critic_step`).

Non-finite losses raise `FloatingPointError`.
"""

import random
from collections import defaultdict

import torch

from coopflow.stages.fit.critic import critic_step, predict_values, value_error
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.agents.logprobs import sequence_logprobs
from coopflow.stages.agents.state import AgentState
from coopflow.stages.agents.value_heads import forward_values


def minibatches(samples: list[dict], batch_size: int, seed: int, step: int, index: int) -> list[list[dict]]:
    """Turn-grouped, seeded-shuffled minibatches of one agent's samples (same on every process)."""
    rng = random.Random(derive_seed(seed, step, index, "shuffle"))
    by_turn: dict[int, list[dict]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: (s["turn"], s["node_id"], s["sample"])):
        by_turn[s["turn"]].append(s)
    out = []
    for turn in sorted(by_turn):
        group = by_turn[turn]
        rng.shuffle(group)
        out += [group[b:b + batch_size] for b in range(0, len(group), batch_size)]
    return out


def agent_values(agent: AgentState, samples: list[dict], critic_type: str) -> list[float]:
    """Old values of one agent's samples from its own critic or value head (no gradient)."""
    if agent.critic is not None:
        return predict_values(agent.critic, samples, critic_type)
    if agent.value_head is None:
        raise ValueError("this agent has no critic and no value head")
    with torch.no_grad():
        agent.model.eval()
        v = forward_values(agent.model, agent.value_head, [s["prompt_ids"] for s in samples],
                           [s["completion_ids"] for s in samples], agent.tokenizer.pad_token_id, critic_type)
    return v.float().tolist()


def _check(name: str, value: torch.Tensor, index: int) -> None:
    if not torch.isfinite(value).all():
        raise FloatingPointError(f"non-finite {name} for agent {index}; lower the learning rates or check rewards")


def update_actor(agent: AgentState, samples: list[dict], batch_size: int, seed: int, step: int, index: int,
                 critic_type: str = "v", value_loss_coef: float = 0.6, value_clip: float | None = None) -> dict:
    """One agent's actor (and own critic / head) update over its samples of one update."""
    model, pad = agent.model, agent.tokenizer.pad_token_id
    opt = agent.ensure_optimizer()
    pl, vl, vp, n_mb = 0.0, 0.0, 0.0, 0
    model.train()
    try:
        for mb in minibatches(samples, batch_size, seed, step, index):
            adv = torch.tensor([s["norm_advantage"] for s in mb], dtype=torch.float32)
            y = torch.tensor([s["value_target"] for s in mb], dtype=torch.float32)
            _check("advantage", adv, index)
            _check("value target", y, index)
            prompts, comps = [s["prompt_ids"] for s in mb], [s["completion_ids"] for s in mb]
            opt.zero_grad(set_to_none=True)
            if agent.value_head is not None:  # shared head: one forward, one loss
                with agent.autocast():
                    values, logp = forward_values(model, agent.value_head, prompts, comps, pad, critic_type, True)
                old = torch.tensor([s["old_value"] for s in mb], dtype=values.dtype, device=values.device)
                policy = -(logp * adv.to(logp.device)).mean()
                value = value_error(values, y.to(values.device), old, value_clip).mean()
                _check("policy/value loss", policy + value, index)
                (policy + value_loss_coef * value).backward()
                opt.step()
                vl += value.item()
                vp += values.mean().item()
            else:
                with agent.autocast():
                    logp = sequence_logprobs(model, prompts, comps, pad)
                policy = -(logp * adv.to(logp.device)).mean()
                _check("policy loss", policy, index)
                policy.backward()
                opt.step()
                if agent.critic is not None:
                    m = critic_step(agent.critic, mb, critic_type, value_loss_coef)
                    vl += m["value_loss"]
                    vp += m["value_pred_mean"]
            pl += policy.item()
            n_mb += 1
    finally:
        model.eval()
    out = {f"agent_{index}/policy_loss": pl / max(1, n_mb)}
    if agent.critic is not None or agent.value_head is not None:
        out[f"agent_{index}/value_loss"] = vl / max(1, n_mb)
        out[f"agent_{index}/value_pred_mean"] = vp / max(1, n_mb)
    return out
