"""Stage: generate rollouts — K sampled completions per agent per item, batched.

For each agent: **one** `generate` call over all items × K completions (prompts repeated K times,
left-padded), under `inference_mode`, with the sampling settings of the run. Each completion is
cut after its first EOS (the EOS itself is kept as the last action token, pads after it are
dropped). Its text — what the reward sees — ends at the first EOS or pad token, as in the
reference (a pad sampled mid-completion ends the text; when pad == EOS the two rules agree), and
is decoded without special tokens. Sampling is reproducible and independent of
resumption: the RNG is seeded per (run seed, update, agent).

A generation that runs longer than `stages.common.progress.HEARTBEAT_S` logs a heartbeat with the agent,
the tokens decoded so far of `max_new_tokens` and the tokens per second (from the decode loop's steps or a
transformers `StoppingCriteria` that never stops anything: one clock read per step).

Output rows (schema `rollouts`): step, item_id, turn, node_id, agent, sample, prompt,
prompt_ids, completion_ids, completion_text, length, finished, ref_kl (k3 KL to the frozen
reference model when reference KL is on, else 0), parent_node, parent_joint (tree links, -1 at roots).
"""

import logging
from dataclasses import dataclass

import torch

from coopflow.artifacts import faults
from coopflow.stages.agents import decode as fast_decode
from coopflow.stages.agents.state import PolicyGroup
from coopflow.stages.common.progress import Heartbeat
from coopflow.stages.common.seeds import derive_seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings for generate (from the trainer config)."""

    num_generations: int
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int | None
    backend: str = "auto"  # auto: the KV-cache loop (stages/agents/decode.py) where the model supports it; hf: generate
    prompt_overflow: str = "error"  # a prompt + max_new_tokens beyond the model's context: error | truncate (left)
    compute_dtype: str = "model"  # the KV-cache loop's compute dtype (model | bfloat16 | float16), resolved from auto
    decode_step: str = "auto"  # how the KV-cache loop runs a decode step (decode.STEP_MODES); never in keys

    @classmethod
    def of(cls, settings, execution, k: int) -> "SamplingConfig":
        """k samples per prompt with a stage's sampling settings and generation backend (`settings`: the stage's
        view of the config, `execution`: the execution settings, for the decode step mode)."""
        t = settings.trainer
        a = settings.agents
        return cls(k, t.max_new_tokens, t.temperature, t.top_p, t.top_k, a.generation_backend, a.prompt_overflow,
                   fast_decode.resolve_compute_dtype(a.compute_dtype, a.device), execution.agents.decode_step)

    def with_k(self, k: int) -> "SamplingConfig":
        """The same settings with k samples per prompt."""
        from dataclasses import replace

        return replace(self, num_generations=k)

    def generation_config(self, tok):
        from transformers import GenerationConfig

        return GenerationConfig(
            do_sample=True, num_beams=1, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k or 0, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, bos_token_id=None)


def trim_completion(row: list[int], eos_id: int | None) -> tuple[list[int], bool]:
    """Cut a generated row after its first EOS; returns (token ids incl. EOS, finished)."""
    if eos_id is not None and eos_id in row:
        e = row.index(eos_id)
        return row[:e + 1], True
    return row, False


def fit_context(tok, prompts: list[str], enc, context: int, sampling: SamplingConfig):
    """Prompts that leave no room for max_new_tokens in the model's context: an error naming the longest
    (prompt_overflow 'error'), or each cut to its last tokens with a warning ('truncate')."""
    import logging

    lengths = enc["attention_mask"].sum(1).tolist()
    room = context - sampling.max_new_tokens
    over = [i for i, n in enumerate(lengths) if n > room]
    if not over:
        return enc
    worst = max(over, key=lambda i: lengths[i])
    if sampling.prompt_overflow != "truncate" or room < 1:
        raise ValueError(f"{len(over)} prompt(s) leave no room for max_new_tokens {sampling.max_new_tokens} in the "
                         f"model's context of {context} tokens (the longest, position {worst}, has {lengths[worst]} "
                         f"tokens: {prompts[worst][:80]!r}...); shorten the prompts, lower trainer.max_new_tokens or "
                         "set agents.prompt_overflow: truncate (keeps each prompt's last tokens)")
    logging.getLogger("coopflow.generate").warning(
        "%d prompt(s) cut to their last %d tokens to fit the model's context of %d (agents.prompt_overflow: "
        "truncate; the longest had %d)", len(over), room, context, lengths[worst])
    side = tok.truncation_side
    tok.truncation_side = "left"
    try:
        return tok(prompts, return_tensors="pt", padding=True, truncation=True, max_length=room)
    finally:
        tok.truncation_side = side


def _heartbeat_criteria(beat: Heartbeat, prompt_len: int):
    """A transformers StoppingCriteria that ticks `beat` with the tokens generated so far and stops nothing."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Beat(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            beat.tick(input_ids.shape[1] - prompt_len)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Beat()])


@torch.inference_mode()
def generate_for_agent(model, tok, prompts: list[str], k: int, sampling: SamplingConfig, seed: int,
                       reference=None, label: str = "agent"):
    """One batched generate: per (prompt, sample) a tuple (prompt_ids, completion_ids, text, finished, ref_kl).

    ref_kl is the k3 KL to `reference` (a frozen model) summed over the completion, 0.0 without one. `label`
    names the agent in the heartbeat lines of a long generation.
    """
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise ValueError(f"empty prompt for item(s) at position {empty}: every agent prompt needs text")
    enc = tok(prompts, return_tensors="pt", padding=True)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and enc["input_ids"].shape[1] + sampling.max_new_tokens > context:
        enc = fit_context(tok, prompts, enc, context, sampling)
    device = next(model.parameters()).device
    input_ids = enc["input_ids"].repeat_interleave(k, dim=0).to(device)
    attn = enc["attention_mask"].repeat_interleave(k, dim=0).to(device)
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: every agent prompt must contain at least one token")
    was_training = model.training
    model.eval()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    beat = Heartbeat(log, f"generate {label}", sampling.max_new_tokens, "tokens", width=input_ids.shape[0])
    if sampling.backend == "auto" and fast_decode.supports(model):
        new = fast_decode.sample(model, input_ids, attn, sampling.max_new_tokens, sampling.temperature,
                                 sampling.top_k, sampling.top_p, tok.eos_token_id, tok.pad_token_id, beat.tick,
                                 None if sampling.compute_dtype == "model" else getattr(torch, sampling.compute_dtype),
                                 step_mode=sampling.decode_step)
    else:  # transformers' generate expands each prompt k times itself (the same rows as repeat_interleave)
        P = input_ids.shape[1]
        out = model.generate(input_ids=input_ids[::k], attention_mask=attn[::k], num_return_sequences=k,
                             return_dict_in_generate=True, generation_config=sampling.generation_config(tok),
                             stopping_criteria=_heartbeat_criteria(beat, P))
        new = (out.sequences if hasattr(out, "sequences") else out)[:, P:]
    beat.done(new.shape[1])
    if was_training:
        model.train()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = []
    seqs = new.tolist()
    for r, row in enumerate(seqs):
        mask = attn[r].tolist()
        p_ids = [t for t, m in zip(input_ids[r].tolist(), mask) if m]
        c_ids, finished = trim_completion(row, eos)
        text_ids = c_ids[:-1] if finished else c_ids
        if pad is not None and pad in text_ids:  # the reference's reward text ends at the first pad token
            text_ids = text_ids[:text_ids.index(pad)]
        text = tok.decode(text_ids, skip_special_tokens=True)
        rows.append([p_ids, c_ids, text, finished, 0.0])
    if reference is not None:
        from coopflow.stages.agents.reference_kl import k3_kl

        kls = k3_kl(model, reference, [r[0] for r in rows], [r[1] for r in rows], tok.pad_token_id)
        for r, kl in zip(rows, kls):
            r[4] = kl
    return [tuple(r) for r in rows]


def generate_op(agent, prompts: list[str], k: int, sampling: SamplingConfig, seed: int,
                label: str = "agent") -> list[tuple]:
    """Per-agent op: `generate_for_agent` on one live agent (with its frozen reference when KL is on)."""
    return generate_for_agent(agent.model, agent.tokenizer, prompts, k, sampling, seed, agent.reference, label)


def generate_rollouts(policies: PolicyGroup, agent_prompts: list[list[str]], item_ids: list[int],
                      sampling: SamplingConfig, seed: int, step: int, turn: int = 0,
                      node_ids: list[int] | None = None, parents: list[tuple[int, int]] | None = None) -> list[dict]:
    """Rollout rows for every agent × node × sample; agent_prompts[i][j] is agent i's prompt at node j.

    Node j belongs to item `item_ids[j]`, has id `node_ids[j]` (default j) and tree parent
    `parents[j]` = (parent node id, parent joint action index), (-1, -1) at a root.
    """
    k = sampling.num_generations
    node_ids = node_ids if node_ids is not None else list(range(len(item_ids)))
    parents = parents if parents is not None else [(-1, -1)] * len(item_ids)
    where = f" turn {turn + 1}" if turn else ""
    outs = policies.run(generate_op, [(agent_prompts[a], k, sampling, derive_seed(seed, step, turn, a),
                                       f"agent {a}{where}") for a in range(policies.n)])
    faults.hit("generate")
    rows: list[dict] = []
    for agent, gen in enumerate(outs):
        for j, item_id in enumerate(item_ids):
            for s in range(k):
                p_ids, c_ids, text, finished, kl = gen[j * k + s]
                rows.append({"step": step, "item_id": item_id, "turn": turn, "node_id": node_ids[j], "agent": agent,
                             "sample": s, "prompt": agent_prompts[agent][j], "prompt_ids": p_ids,
                             "completion_ids": c_ids, "completion_text": text, "length": len(c_ids),
                             "finished": finished, "ref_kl": kl, "parent_node": parents[j][0],
                             "parent_joint": parents[j][1]})
    return rows
