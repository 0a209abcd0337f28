"""Stage: update policies — one on-policy policy-gradient step per minibatch, per agent.

For agent i, the node samples of one rollout buffer (a node sample = the K completions of one
agent at one node) are grouped by turn, shuffled with a seeded RNG and split into minibatches of
`train_batch_size` node samples. Per minibatch, **one padded, masked forward** over all of its
completions gives the summed completion log-probs, and

    loss = (1/|mb|) Σ_samples (1/K) Σ_k −log π(c_k | prompt) · A_k

then zero_grad → backward → AdamW step. No ratio, clipping or entropy bonus (the reference's
REINFORCE-style update); the K completions of a node share one forward over their prompt
(`sequence_logprobs`). A non-finite loss raises instead of being skipped. By default
(`loss_on_padding`) the completion tokens are CoMLRL's: the node's padded rows minus their last token.
"""

import random
from collections import defaultdict

import torch

from coopflow.artifacts import faults
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.agents.logprobs import sequence_logprobs
from coopflow.stages.agents.state import AgentState, PolicyGroup


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


def loss_rows(samples: list[list[dict]], pad_id: int, pad_tail: bool = False) -> list[tuple]:
    """One (prompt_ids, completion_ids, advantage, weight) per completion of a minibatch of node samples.

    `pad_tail` (the reference's exact loss, `loss_on_padding`, on by default): each completion is padded
    with pad tokens to the longest completion of its node, as CoMLRL's per-node `generate` returns it,
    and those pads enter the loss; the last token of every padded row is not scored (CoMLRL's logits
    slice `[P-1:-1]` of a forward over `prompt ‖ row[:-1]` holds one logit fewer than the row has tokens).
    """
    rows = []
    for node in samples:
        longest = max(len(c["completion_ids"]) for c in node)
        for c in node:
            ids = list(c["completion_ids"])
            comp = (ids + [pad_id] * (longest - len(ids)))[:-1] if pad_tail else ids
            rows.append((c["prompt_ids"], comp, c["advantage"], 1.0 / (len(samples) * len(node))))
    return rows


def rows_loss(model, rows: list[tuple], pad_id: int) -> torch.Tensor:
    """-sum_i w_i A_i log π(c_i|p_i) over the rows, in one padded forward."""
    device = next(model.parameters()).device
    logp = sequence_logprobs(model, [r[0] for r in rows], [r[1] for r in rows], pad_id)
    A = torch.tensor([r[2] for r in rows], dtype=logp.dtype, device=device)
    w = torch.tensor([r[3] for r in rows], dtype=logp.dtype, device=device)
    return -(w * logp * A).sum()


def chunk_rows(rows: list[tuple], max_tokens: int | None) -> list[list[tuple]]:
    """The rows in forward-sized chunks: all at once (None), else sorted and cut so that each chunk's padded size
    (rows × its longest prompt + completion) stays within `max_tokens` (a longer row goes alone). Sorted by prompt
    length, then prompt, then completion length: a node's K completions stay together (their prompt then runs once,
    `sequence_logprobs`) and each chunk pads to its own longest row."""
    if not max_tokens:
        return [rows]
    out, cur, longest = [], [], 0
    for r in sorted(rows, key=lambda r: (len(r[0]), r[0], len(r[1]))):
        n = len(r[0]) + len(r[1])
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, n)
    return out + ([cur] if cur else [])


def policy_loss(model, samples: list[list[dict]], pad_id: int, pad_tail: bool = False) -> tuple[torch.Tensor, int]:
    """Minibatch loss (one forward over every completion of every node sample) and its token count."""
    rows = loss_rows(samples, pad_id, pad_tail)
    return rows_loss(model, rows, pad_id), sum(len(r[1]) for r in rows)


def update_agent(agent: AgentState, rollouts: list[dict], adv: dict[tuple, float], batch_size: int, seed: int,
                 step: int, index: int, pad_tail: bool = False, chunk_tokens: int | None = None) -> dict[str, float]:
    """One agent's update over its node samples of one buffer (runs wherever the agent lives).

    `chunk_tokens` (trainer.loss_chunk_tokens): a minibatch's loss is a sum over its completions, so it can run
    as several forward/backward passes whose gradients add up (one AdamW step per minibatch either way): peak
    activation memory follows the chunk, not the minibatch."""
    model, tok = agent.model, agent.tokenizer
    opt = agent.ensure_optimizer()
    rng = random.Random(derive_seed(seed, step, index, "shuffle"))
    losses, tokens = [], 0
    model.train()
    try:
        for turn, samples in sorted(_node_samples(rollouts, adv, index).items()):
            rng.shuffle(samples)
            for b in range(0, len(samples), batch_size):
                rows = loss_rows(samples[b:b + batch_size], tok.pad_token_id, pad_tail)
                opt.zero_grad(set_to_none=True)
                total = 0.0
                for chunk in chunk_rows(rows, chunk_tokens):
                    with agent.autocast():  # (agents.compute_dtype; the backward follows the forward's dtypes)
                        loss = rows_loss(model, chunk, tok.pad_token_id)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"non-finite policy loss ({loss.item()}) for agent {index} at update "
                                                 f"{step}, turn {turn + 1}; lower agent_learning_rate or check rewards")
                    loss.backward()
                    total += loss.item()
                opt.step()
                losses.append(total)
                tokens += sum(len(r[1]) for r in rows)
    finally:
        model.eval()
    return {f"agent_{index}/policy_loss": sum(losses) / max(1, len(losses)), f"agent_{index}/train_tokens": float(tokens)}


def update_policies(policies: PolicyGroup, rollouts: list[dict], advantage_rows: list[dict], batch_size: int,
                    seed: int, step: int, pad_tail: bool = False, chunk_tokens: int | None = None) -> dict[str, float]:
    """Apply one buffer's update to every agent (in place, or in the agents' worker processes)."""
    args = []
    for i in range(policies.n):
        mine = [r for r in rollouts if r["agent"] == i]
        adv = {(a["step"], a["turn"], a["node_id"], a["agent"], a["sample"]): a["advantage"]
               for a in advantage_rows if a["agent"] == i}
        args.append((mine, adv, batch_size, seed, step, i, pad_tail, chunk_tokens))
    metrics: dict[str, float] = {}
    for m in policies.run(update_agent, args):
        metrics.update(m)
    faults.hit("update")
    return metrics
