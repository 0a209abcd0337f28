"""Stage: update policies — one on-policy policy-gradient step per minibatch, per agent.

For agent i, the node samples of one rollout buffer (a node sample = the K completions of one
agent at one node) are grouped by turn, shuffled with a seeded RNG and split into minibatches of
`train_batch_size` node samples. Per minibatch, **one padded, masked forward** over all of its
completions (or over chunks of them, `trainer.loss_chunk_tokens`: by default for a float32 loss, whose
gradients add up before the step) gives the summed completion log-probs, and

    loss = (1/|mb|) Σ_samples (1/K) Σ_k −log π(c_k | prompt) · A_k

then zero_grad → backward → AdamW step. No ratio, clipping or entropy bonus (the reference's
REINFORCE-style update); the K completions of a node share one forward over their prompt
(`sequence_logprobs`). A non-finite loss raises instead of being skipped. By default
(`loss_on_padding`) the completion tokens are CoMLRL's: the node's padded rows minus their last token.

**Clipped multi-epoch updates** (coopflow extension, `Objective`): with `epochs` > 1 or a `clip_range`,
every agent makes `epochs` passes over its buffer (reshuffled per pass) and each token's log-prob enters
through the ratio to the policy that sampled the buffer, ρ_t = π(c_t | ·) / π_old(c_t | ·):

    token:    loss = (1/|mb|) Σ_samples (1/K) Σ_t −min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A)      (PPO / GRPO)
    sequence: loss = (1/|mb|) Σ_samples (1/K) −min(s A, clip(s, 1−ε, 1+ε) A),
              s = exp((1/|c|) Σ_t log ρ_t)                                                  (GSPO)

(no clipping without a clip_range). π_old's token log-probs are taken once, before the agent's first
optimizer step of the update (one no-grad forward over the buffer; the first minibatch's own forward
serves for its rows), so they are the sampling policy's. At ρ = 1 the token form's gradient equals the
REINFORCE loss's (Σ_t ∇log π · A); the sequence form's is its per-token mean (GSPO's length
normalization). Logged per agent: clip_fraction (share of tokens — sequences for GSPO — whose clipped
term is the active one), approx_kl (mean k3 estimate (ρ − 1) − log ρ per token, against π_old) and
ratio_mean, averaged over the update's minibatches.
"""

import random
from collections import defaultdict
from itertools import groupby
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from coopflow.artifacts import faults
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.agents.logprobs import completion_mask, sequence_logprobs, shares_prompts
from coopflow.stages.agents.state import AgentState, PolicyGroup


@dataclass(frozen=True)
class Objective:
    """How one update turns advantages into a loss: `epochs` passes over the buffer, the ratio clipped to
    [1 − clip_range, 1 + clip_range] (None: unclipped), per token or per sequence (`ratio_level`). The default
    is CoMLRL's single REINFORCE step."""

    epochs: int = 1
    clip_range: float | None = None
    ratio_level: str = "token"

    @property
    def uses_ratio(self) -> bool:
        """Whether the loss needs the sampling policy's log-probs (the plain REINFORCE step does not)."""
        return self.epochs > 1 or self.clip_range is not None


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
    """One (prompt_ids, completion_ids, advantage, weight, key) per completion of a minibatch of node samples
    (key: (step, turn, node_id, sample), which names the completion across passes).

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
            rows.append((c["prompt_ids"], comp, c["advantage"], 1.0 / (len(samples) * len(node)),
                         tuple(c.get(k) for k in ("step", "turn", "node_id", "sample"))))
    return rows


def rows_loss(model, rows: list[tuple], pad_id: int) -> torch.Tensor:
    """-sum_i w_i A_i log π(c_i|p_i) over the rows, in one padded forward."""
    device = next(model.parameters()).device
    logp = sequence_logprobs(model, [r[0] for r in rows], [r[1] for r in rows], pad_id)
    A = torch.tensor([r[2] for r in rows], dtype=logp.dtype, device=device)
    w = torch.tensor([r[3] for r in rows], dtype=logp.dtype, device=device)
    return -(w * logp * A).sum()


def clipped_rows_loss(model, rows: list[tuple], pad_id: int, old: dict[tuple, torch.Tensor], obj: Objective,
                      capture: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate over the rows in one padded forward, and its statistics (clip_fraction, approx_kl,
    ratio_mean). `old[key]`: the sampling policy's token log-probs of that row ([len(completion)]). With `capture`
    (the update's first minibatch, whose forward comes before any step) a row missing from `old` is scored at
    ratio 1 and its log-probs are stored there; otherwise a missing row is an error."""
    device = next(model.parameters()).device
    _, tok = sequence_logprobs(model, [r[0] for r in rows], [r[1] for r in rows], pad_id, return_tokens=True)
    mask = completion_mask([r[1] for r in rows], tok)
    missing = [i for i, r in enumerate(rows) if r[4] not in old]
    if missing and not capture:
        raise RuntimeError(f"no sampling-policy log-probs for completion {rows[missing[0]][4]} (they are taken "
                           f"before the update's first step)")
    if missing:
        old.update(_row_logprobs(tok.detach()[missing], [rows[i] for i in missing]))
    ref = pad_sequence([old[r[4]] for r in rows], batch_first=True).to(device)
    ref = torch.nn.functional.pad(ref, (0, tok.shape[1] - ref.shape[1]))  # [B, C] like tok (all rows may be shorter)
    A = torch.tensor([r[2] for r in rows], dtype=tok.dtype, device=device)
    w = torch.tensor([r[3] for r in rows], dtype=tok.dtype, device=device)
    log_ratio = (tok - ref.to(tok.dtype)) * mask
    lo, hi = (1 - obj.clip_range, 1 + obj.clip_range) if obj.clip_range is not None else (None, None)
    if obj.ratio_level == "sequence":
        lens = mask.sum(-1).clamp(min=1)
        ratio = torch.exp(log_ratio.sum(-1) / lens)  # [B]
        surr, clipped = _surrogate(ratio, A, lo, hi)
        loss = -(w * surr).sum()
        frac = clipped.double().mean()
    else:
        ratio = torch.exp(log_ratio)  # [B, C]
        surr, clipped = _surrogate(ratio, A[:, None], lo, hi)
        loss = -(w * (surr * mask).sum(-1)).sum()
        frac = (clipped & mask).sum().double() / mask.sum().clamp(min=1)
    with torch.no_grad():
        lr = log_ratio.detach().double()
        n = mask.sum().clamp(min=1)
        stats = {"clip_fraction": float(frac), "approx_kl": float(((torch.exp(lr) - 1 - lr) * mask).sum() / n),
                 "ratio_mean": float((torch.exp(lr) * mask).sum() / n)}
    return loss, stats


def _surrogate(ratio: torch.Tensor, A: torch.Tensor, lo: float | None, hi: float | None):
    """min(ρA, clip(ρ)A) and where the clipped term is the smaller (the active) one."""
    unclipped = ratio * A
    if lo is None:
        return unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    clipped = torch.clamp(ratio, lo, hi) * A
    return torch.minimum(unclipped, clipped), clipped < unclipped


AUTO_LOSS_CHUNK_TOKENS = 1024
"""`trainer.loss_chunk_tokens: auto` where an agent's loss runs in float32 (no autocast, float32 weights): float32
activations are twice bf16's, and a pass of this many tokens ran as fast as the whole minibatch at once
(docs/benchmarks.md, "Peak memory")."""


def resolve_chunk_tokens(setting: int | str | None, agent: AgentState) -> int | None:
    """`trainer.loss_chunk_tokens` for this agent: 'auto' is AUTO_LOSS_CHUNK_TOKENS where its loss passes run in
    float32 and the whole minibatch in one pass under a bf16 / fp16 autocast or with half-precision weights (chunks
    there saved no memory and cost update speed, measured); a number or None as given."""
    if setting != "auto":
        return setting
    autocast = agent.compute_dtype not in (None, "model")
    return AUTO_LOSS_CHUNK_TOKENS if not autocast and next(agent.model.parameters()).dtype == torch.float32 else None


def chunk_rows(rows: list[tuple], max_tokens: int | None, shared: bool = False) -> list[list[tuple]]:
    """The rows in forward-sized chunks: all at once, in the order given, when they fit in `max_tokens` (or it is
    None); else sorted by prompt length, prompt, then completion length and cut so that each chunk's padded tokens
    stay within it, whole prompts at a time (a node's K completions stay together, so their prompt runs once; a
    prompt whose rows alone exceed the cap is cut by rows, and a row longer than the cap goes alone). A chunk's
    tokens: rows × (longest prompt + longest completion), or with `shared` (the model runs each distinct prompt once
    under its completions, `sequence_logprobs`) distinct prompts × longest prompt + rows × longest completion."""

    def tokens(chunk: list[tuple]) -> int:
        prompts = len({tuple(r[0]) for r in chunk}) if shared else len(chunk)
        return prompts * max(len(r[0]) for r in chunk) + len(chunk) * max(len(r[1]) for r in chunk)

    if not max_tokens or tokens(rows) <= max_tokens:
        return [rows]
    ordered = sorted(rows, key=lambda r: (len(r[0]), r[0], len(r[1])))
    out, cur = [], []
    for group in (list(g) for _, g in groupby(ordered, key=lambda r: r[0])):  # the rows of one prompt
        if cur and tokens(cur + group) > max_tokens:
            out.append(cur)
            cur = []
        for r in group:  # (the whole group when it fits; else row by row)
            if cur and tokens(cur + [r]) > max_tokens:
                out.append(cur)
                cur = []
            cur.append(r)
    return out + ([cur] if cur else [])


def policy_loss(model, samples: list[list[dict]], pad_id: int, pad_tail: bool = False) -> tuple[torch.Tensor, int]:
    """Minibatch loss (one forward over every completion of every node sample) and its token count."""
    rows = loss_rows(samples, pad_id, pad_tail)
    return rows_loss(model, rows, pad_id), sum(len(r[1]) for r in rows)


def _minibatches(rollouts: list[dict], adv: dict[tuple, float], index: int, batch_size: int, rng: random.Random,
                 pad_id: int, pad_tail: bool) -> list[tuple[int, list[tuple]]]:
    """One pass's (turn, loss rows) minibatches: each turn's node samples shuffled by `rng`, then cut."""
    out = []
    for turn, samples in sorted(_node_samples(rollouts, adv, index).items()):
        rng.shuffle(samples)
        out += [(turn, loss_rows(samples[b:b + batch_size], pad_id, pad_tail))
                for b in range(0, len(samples), batch_size)]
    return out


@torch.no_grad()
def sampling_logprobs(agent: AgentState, rows: list[tuple], chunk_tokens: int | None) -> dict[tuple, torch.Tensor]:
    """{row key: token log-probs [len(completion)]} under the agent's current (sampling) policy, no gradients."""
    out = {}
    for chunk in chunk_rows(rows, chunk_tokens, shares_prompts(agent.model)):
        with agent.autocast():
            _, tok = sequence_logprobs(agent.model, [r[0] for r in chunk], [r[1] for r in chunk],
                                       agent.tokenizer.pad_token_id, return_tokens=True)
        out.update(_row_logprobs(tok, chunk))
    return out


def _row_logprobs(tok: torch.Tensor, rows: list[tuple]) -> dict[tuple, torch.Tensor]:
    """{row key: its completion's token log-probs [len(completion)], float32 on the CPU} from `tok` [B, C]."""
    return {r[4]: tok[b, :len(r[1])].float().cpu() for b, r in enumerate(rows)}


def update_agent(agent: AgentState, rollouts: list[dict], adv: dict[tuple, float], batch_size: int, seed: int,
                 step: int, index: int, pad_tail: bool = False, chunk_tokens: int | str | None = None,
                 objective: Objective = Objective()) -> dict[str, float]:
    """One agent's update over its node samples of one buffer (runs wherever the agent lives).

    `chunk_tokens` (trainer.loss_chunk_tokens, 'auto' resolved by `resolve_chunk_tokens`): a minibatch's loss is a
    sum over its completions, so it can run as several forward/backward passes whose gradients add up (one AdamW
    step per minibatch either way): peak activation memory follows the chunk, not the minibatch. `objective`:
    passes and ratio clipping (the default is the reference's one REINFORCE step)."""
    model, tok = agent.model, agent.tokenizer
    opt = agent.ensure_optimizer()
    chunk_tokens, shared = resolve_chunk_tokens(chunk_tokens, agent), shares_prompts(model)
    rng = random.Random(derive_seed(seed, step, index, "shuffle"))
    losses, tokens = [], 0
    stats: dict[str, list[float]] = defaultdict(list)
    old: dict[tuple, torch.Tensor] = {}
    model.train()
    try:
        for epoch in range(objective.epochs):
            batches = _minibatches(rollouts, adv, index, batch_size, rng, tok.pad_token_id, pad_tail)
            if epoch == 0 and objective.uses_ratio and len(batches) > 1:  # before the first step: π_old
                old.update(sampling_logprobs(agent, [r for _, rows in batches[1:] for r in rows], chunk_tokens))
            for i, (turn, rows) in enumerate(batches):
                opt.zero_grad(set_to_none=True)
                total = 0.0
                for chunk in chunk_rows(rows, chunk_tokens, shared):
                    with agent.autocast():  # (agents.compute_dtype; the backward follows the forward's dtypes)
                        if objective.uses_ratio:
                            loss, st = clipped_rows_loss(model, chunk, tok.pad_token_id, old, objective,
                                                         capture=epoch == 0 and i == 0)
                            for k, v in st.items():
                                stats[k].append(v)
                        else:
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
    out = {f"agent_{index}/policy_loss": sum(losses) / max(1, len(losses)),
           f"agent_{index}/train_tokens": float(tokens)}
    out.update({f"agent_{index}/{k}": sum(v) / len(v) for k, v in stats.items()})
    return out


def update_policies(policies: PolicyGroup, rollouts: list[dict], advantage_rows: list[dict], batch_size: int,
                    seed: int, step: int, pad_tail: bool = False, chunk_tokens: int | None = None,
                    objective: Objective = Objective()) -> dict[str, float]:
    """Apply one buffer's update to every agent (in place, or in the agents' worker processes)."""
    args = []
    for i in range(policies.n):
        mine = [r for r in rollouts if r["agent"] == i]
        adv = {(a["step"], a["turn"], a["node_id"], a["agent"], a["sample"]): a["advantage"]
               for a in advantage_rows if a["agent"] == i}
        args.append((mine, adv, batch_size, seed, step, i, pad_tail, chunk_tokens, objective))
    metrics: dict[str, float] = {}
    for m in policies.run(update_agent, args):
        metrics.update(m)
    faults.hit("update")
    return metrics
