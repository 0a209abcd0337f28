"""Stage: update policies — one on-policy policy-gradient step per minibatch, per agent.

For agent i, the node samples of one rollout buffer (a node sample = the K completions of one
agent at one node) are grouped by turn, shuffled with a seeded RNG and split into minibatches of
`train_batch_size` node samples. Per minibatch, **one padded, masked forward** over all of its
completions gives the summed completion log-probs, and

    loss = (1/|mb|) Σ_samples (1/K) Σ_k −log π(c_k | prompt) · A_k

then zero_grad → backward → AdamW step. No ratio, clipping or entropy bonus (the reference's
REINFORCE-style update). A non-finite loss raises instead of being skipped. By default
(`loss_on_padding`) the completion tokens are CoMLRL's: the node's padded rows minus their last token.
"""

import random
from collections import defaultdict

import torch

from artifacts import faults
from stages.common.seeds import derive_seed
from stages.agents.logprobs import sequence_logprobs
from stages.agents.state import AgentState, PolicyGroup


def _node_samples(rollouts: list[dict], adv: dict[tuple, float], agent: int) -> dict[int, list[list[dict]]]:
    """turn -> list of node samples (each a list of completion dicts with 'advantage')."""
    nodes: dict[tuple, list[dict]] = defaultdict(list)
    for r in rollouts:
        if r["agent"] == agent:
            key = (r["step"], r["turn"], r["node_id"])
            nodes[key].append({**r, "advantage": adv[key + (agent, r["sample"])]})
    by_turn: dict[int, list[list[dict]]] = defaultdict(list)
    for key in sorted(nodes):
        by_turn[key[1]].append(sorted(nodes[key], key=lambda x: x["sample"]))
    return by_turn


def policy_loss(model, samples: list[list[dict]], pad_id: int, pad_tail: bool = False) -> tuple[torch.Tensor, int]:
    """Minibatch loss (one forward over every completion of every node sample) and its token count.

    `pad_tail` (the reference's exact loss, `loss_on_padding`, on by default): each completion is padded
    with pad tokens to the longest completion of its node, as CoMLRL's per-node `generate` returns it,
    and those pads enter the loss; the last token of every padded row is not scored (CoMLRL's logits
    slice `[P-1:-1]` of a forward over `prompt ‖ row[:-1]` holds one logit fewer than the row has tokens).
    """
    prompts, comps, adv, weight = [], [], [], []
    for node in samples:
        longest = max(len(c["completion_ids"]) for c in node)
        for c in node:
            prompts.append(c["prompt_ids"])
            ids = list(c["completion_ids"])
            comps.append((ids + [pad_id] * (longest - len(ids)))[:-1] if pad_tail else ids)
            adv.append(c["advantage"])
            weight.append(1.0 / (len(samples) * len(node)))
    device = next(model.parameters()).device
    logp = sequence_logprobs(model, prompts, comps, pad_id)
    A = torch.tensor(adv, dtype=logp.dtype, device=device)
    w = torch.tensor(weight, dtype=logp.dtype, device=device)
    return -(w * logp * A).sum(), sum(len(c) for c in comps)


def update_agent(agent: AgentState, rollouts: list[dict], adv: dict[tuple, float], batch_size: int, seed: int,
                 step: int, index: int, pad_tail: bool = False) -> dict[str, float]:
    """One agent's update over its node samples of one buffer (runs wherever the agent lives)."""
    model, tok = agent.model, agent.tokenizer
    opt = agent.ensure_optimizer()
    rng = random.Random(derive_seed(seed, step, index, "shuffle"))
    losses, tokens = [], 0
    model.train()
    try:
        for turn, samples in sorted(_node_samples(rollouts, adv, index).items()):
            rng.shuffle(samples)
            for b in range(0, len(samples), batch_size):
                mb = samples[b:b + batch_size]
                opt.zero_grad(set_to_none=True)
                with agent.autocast():  # (agents.compute_dtype; the backward follows the forward's dtypes)
                    loss, ntok = policy_loss(model, mb, tok.pad_token_id, pad_tail)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite policy loss ({loss.item()}) for agent {index} at update "
                                             f"{step}, turn {turn + 1}; lower agent_learning_rate or check rewards")
                loss.backward()
                opt.step()
                losses.append(loss.item())
                tokens += ntok
    finally:
        model.eval()
    return {f"agent_{index}/policy_loss": sum(losses) / max(1, len(losses)), f"agent_{index}/train_tokens": float(tokens)}


def update_policies(policies: PolicyGroup, rollouts: list[dict], advantage_rows: list[dict], batch_size: int,
                    seed: int, step: int, pad_tail: bool = False) -> dict[str, float]:
    """Apply one buffer's update to every agent (in place, or in the agents' worker processes)."""
    args = []
    for i in range(policies.n):
        mine = [r for r in rollouts if r["agent"] == i]
        adv = {(a["step"], a["turn"], a["node_id"], a["agent"], a["sample"]): a["advantage"]
               for a in advantage_rows if a["agent"] == i}
        args.append((mine, adv, batch_size, seed, step, i, pad_tail))
    metrics: dict[str, float] = {}
    for m in policies.run(update_agent, args):
        metrics.update(m)
    faults.hit("update")
    return metrics
