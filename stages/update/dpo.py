"""Stage: DPO update — joint-factorized, reference-free multi-agent DPO.

A preference pair compares two joint answers (one completion per agent each). For agent j,
Δ_j = log π_j(y_w^j | x_j) − log π_j(y_l^j | x_j), completions trimmed at their first pad token.
Agent i's loss over a batch of pairs is

    L_i = mean_pairs −log σ( β · (Δ_i + Σ_{j≠i} sg(Δ_j)) )

with sg = stop-gradient: the other agents' Δ are computed first (no grad), so agent i gets
gradients only through its own log-probs, and each agent steps its own optimizer on its own L_i.
One padded forward per agent per batch covers all its chosen and rejected completions.
Logged: `dpo/loss`, `rewards/margins` (mean β·joint Δ) and `rewards/accuracies` (joint Δ > 0).
"""

import torch
import torch.nn.functional as F

from coopflow.stages.agents.logprobs import sequence_logprobs
from coopflow.stages.agents.state import AgentState


def trim_at_pad(ids: list[int], pad_id: int | None) -> list[int]:
    """Completion tokens up to (not including) the first pad token."""
    if pad_id is not None and pad_id in ids:
        return ids[:ids.index(pad_id)]
    return list(ids)


def _deltas(agent: AgentState, pairs: list[dict]) -> torch.Tensor:
    """Δ per pair [B] from one forward over the 2B chosen + rejected completions."""
    pad = agent.tokenizer.pad_token_id
    prompts = [p["prompt_ids"] for p in pairs] * 2
    comps = [trim_at_pad(p["chosen_ids"], pad) for p in pairs] + [trim_at_pad(p["rejected_ids"], pad) for p in pairs]
    logp = sequence_logprobs(agent.model, prompts, comps, pad)
    return logp[:len(pairs)] - logp[len(pairs):]


def dpo_deltas(agent: AgentState, pairs: list[dict]) -> list[float]:
    """This agent's Δ for every pair (no gradient): what the other agents treat as constants."""
    with torch.no_grad():
        agent.model.eval()
        return _deltas(agent, pairs).float().tolist()


def dpo_loss(own: torch.Tensor, others: torch.Tensor, beta: float) -> torch.Tensor:
    """mean −log σ(β (Δ_own + Σ others)); `others` is a constant (no gradient flows into it)."""
    return -F.logsigmoid(beta * (own + others.detach())).mean()


def dpo_step(agent: AgentState, pairs: list[dict], others: list[float], beta: float, index: int) -> dict[str, float]:
    """One AdamW step of agent `index` on its own joint-factorized DPO loss."""
    opt = agent.ensure_optimizer()
    agent.model.train()
    try:
        opt.zero_grad(set_to_none=True)
        with agent.autocast():
            own = _deltas(agent, pairs)
        loss = dpo_loss(own, torch.tensor(others, dtype=own.dtype, device=own.device), beta)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite DPO loss for agent {index}; lower agent_learning_rate or dpo_beta")
        loss.backward()
        opt.step()
    finally:
        agent.model.eval()
    return {f"agent_{index}/dpo_loss": loss.item()}


def dpo_update(policies, batch: dict[int, list[dict]], beta: float) -> dict[str, float]:
    """Update every agent on a batch of pairs ({agent: that agent's pair rows, in pair order})."""
    n = policies.n
    deltas = policies.run(dpo_deltas, [(batch[a],) for a in range(n)])
    joint = [sum(deltas[a][p] for a in range(n)) for p in range(len(batch[0]))]
    args = [(batch[a], [joint[p] - deltas[a][p] for p in range(len(joint))], beta, a) for a in range(n)]
    metrics: dict[str, float] = {}
    for m in policies.run(dpo_step, args):
        metrics.update(m)
    margins = [beta * d for d in joint]
    metrics["rewards/margins"] = sum(margins) / len(margins)
    metrics["rewards/accuracies"] = sum(1.0 for d in joint if d > 0) / len(joint)
    metrics["dpo/loss"] = sum(v for k, v in metrics.items() if k.endswith("/dpo_loss")) / n
    return metrics
