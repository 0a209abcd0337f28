"""Speed levers on a real model, one at a time, against the current path (issue 23).

    python bench/bench_levers.py [--model .bench/models/smollm2-135m-instruct] [--rows 8] [--tokens 128]
                                 [--repeats 3] [--threads 1] [--levers decode_bf16 loss_bf16 ...]

Each lever is timed against its baseline in the same process, interleaved (baseline, lever, baseline, ...),
so machine drift cancels; the printed ratio is baseline / lever (> 1: the lever wins). Levers:

- decode_bf16: the KV-cache decode loop with bfloat16 matmuls and cache (`agents.compute_dtype`) vs the
  weights' float32; numerics: greedy tokens agree, and per-token log-prob difference of the prefill logits.
- decode_fused: the decode loop's fused ops (one F.rms_norm per norm, top-p sorting only the top-k survivors)
  vs the op-by-op form; bf16 matmuls, T 0.8, top-k 50, top-p 0.95; tokens compared (bf16 logits tie often, and
  tied tokens at the top-p edge may be ordered differently: other tokens, the same distribution).
- prefill_shared: the decode loop prefilling each distinct prompt once (K samples share it) vs every row;
  HumanEval-length prompts (~230 tokens), `--rows` = 4 prompts x rows/4 samples, bf16 matmuls; tokens must be equal.
- loss_shared_prompts: the policy loss forward + backward with each distinct prompt run once (its K completions on
  its KV cache) vs one forward per row; HumanEval-length prompts, 4 prompts x rows/4 completions, bf16 autocast.
- decode_static / decode_compile: the decode loop's static-shape step (the form a CUDA graph replays) and that step
  through torch.compile, vs the dynamic step; tokens must be equal. decode_compile also reports the first call
  (which compiles) and a call after the weights changed (as after an update).
- loss_bf16: the policy-gradient loss forward + backward under CPU autocast bfloat16 vs float32.
- adamw_fused: fused AdamW step vs the for-each implementation.
- decode_rows: seconds per 1000 decoded tokens at --rows vs 4x --rows (how bound by weight reads the step is).
- loss_eager_attention: the shared-prompt loss forward + backward with eager attention vs SDPA (bf16 autocast).
- decode_packed / decode_narrow_cache / decode_survivors: one bf16 decode lever off vs on (weights pre-packed for
  oneDNN; KV cache and attention in bf16; tokens drawn from the top-k survivors), runs' sampling (T 0.8, top-k 50,
  top-p 0.95), HumanEval-length prompts.
- decode_pack_hint: decode weights packed for oneDNN with a 1-row batch hint (the default) vs the decode's own row
  count; tokens compared.
- decode_frozen: one decode step's projection matmuls through torch.compile with weight freezing (max-autotune:
  inductor's own GEMM kernels) vs oneDNN's packed kernels: ms, GB/s, compile seconds (first, and again after the
  weights change, as after every update), largest difference.
- decode_prefix_attention: one layer's decode attention (random bf16 data of the model's shapes) as SDPA over each
  row's whole cache vs shared-prefix attention (each prompt's keys read once for its K samples, merged with the
  rows' own keys by log-sum-exp); seconds per 1000 calls, error against float32.
- decode_shared_attention: the decode loop (bf16 matmuls, runs' sampling) with each prompt's cached keys/values read
  once per step for its samples (`sample(shared_attention=True)`, the default where the KV cache stays float32 on
  a CPU) vs SDPA over every row's copy; 2 prompts x rows/2 samples (the runs' shape); tokens compared.
- loss_chunked_lse: the shared-prompt loss forward + backward (bf16 autocast) with the sampled tokens' log-probs
  taken block by block in float32 (`token_logprobs`, blocks of `BLOCK_FLOATS`: coopflow's default) vs the float32
  copy of every position's logits and autograd's logsumexp; loss and gradients compared.
- loss_lse_block: the same loss pass with 64 positions per float32 block vs `BLOCK_FLOATS` values (the default).
- loss_wide_attention: the shared-prompt loss forward + backward (bf16 autocast) with SDPA on float32 queries, keys
  and values (coopflow's choice where bf16 attention is not the fast kernel: CPUs without AMX) vs on bf16 ones;
  loss and the gradients' relative difference.
- decode_fp32_packed: a float32 decode loop (float32 runs' dtype) with its matmul weights reordered once per call
  for oneDNN (batch hint: --rows) vs F.linear; the runs' sampling; the largest product difference and the share of
  tokens that agree (float32 runs must sample `generate`'s tokens).
- decode_parts: where a bf16 decode step's time goes, 2 prompts x rows/2 samples: the step, then without its
  projection matmuls (precomputed outputs), then without its attention too: matmuls, attention and the rest in ms.
- decode_floor: a decode step against its physical floor, at --rows and 2x --rows: step ms with every bf16
  lever on (lever) and off (base), the matmuls alone, weight bytes / step time as GB/s, this core's read
  bandwidth and one thread's dense matmul peak, both measured in the same run. The floor is the larger of the
  time to read the step's weights once (weight bytes / read bandwidth; the best of a float32 dot and sum over
  weight-sized buffers) and the time its matmul FLOPs take at the peak (2 x rows x weights / peak): on a CPU with
  AMX the read binds, on one with AVX512-BF16 only the arithmetic does from ~8 rows. Also the float32 step
  (float32 matmuls, the weights' own dtype) against its floor (twice the bytes, the float32 peak).

The model defaults to the catalog's SmolLM2-135M-Instruct (`coopflow models install smollm2-135m-instruct`),
whose time is matmuls over 30 layers, not per-call overhead. Wait for a quiet machine before trusting numbers.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flops import timed as _timed  # noqa: E402  (bench/ is on the path when this script runs)

PROMPTS = ["Write a Python function that returns the sum of the squares of a list of integers.",
           "Explain in two sentences why the sky looks blue during the day."]


def interleave(base, lever, repeats: int) -> tuple[float, float]:
    """Median seconds of base() and lever(), alternated `repeats` times after one warm-up each."""
    base(), lever()
    tb, tl = [], []
    for _ in range(repeats):
        t = time.perf_counter(); base(); tb.append(time.perf_counter() - t)
        t = time.perf_counter(); lever(); tl.append(time.perf_counter() - t)
    return statistics.median(tb), statistics.median(tl)


def load(model_dir: str):
    from coopflow.stages.agents.models import load_agent

    model, tok = load_agent(model_dir, "float32", "sdpa", "cpu")
    return model, tok


def batch(tok, rows: int):
    prompts = [tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % 2]}], tokenize=False,
                                       add_generation_prompt=True) for i in range(rows)]
    return tok(prompts, return_tensors="pt", padding=True)


def lever_decode_bf16(model, tok, a) -> dict:
    from coopflow.stages.agents.decode import sample

    enc = batch(tok, a.rows)
    ids, mask = enc["input_ids"], enc["attention_mask"]

    def run(dt):
        torch.manual_seed(0)
        return sample(model, ids, mask, a.tokens, 1.0, 50, 1.0, None, tok.pad_token_id, compute_dtype=dt)

    tb, tl = interleave(lambda: run(None), lambda: run(torch.bfloat16), a.repeats)
    # numerics: greedy continuations (top_k 1) and the prefill's next-token log-probs
    g32 = sample(model, ids, mask, 32, 1.0, 1, 1.0, None, tok.pad_token_id)
    g16 = sample(model, ids, mask, 32, 1.0, 1, 1.0, None, tok.pad_token_id, compute_dtype=torch.bfloat16)
    agree = (g32 == g16).float().mean().item()
    return {"base_s": tb, "lever_s": tl, "greedy_token_agreement": round(agree, 3),
            "tokens_per_s_base": a.rows * a.tokens / tb, "tokens_per_s_lever": a.rows * a.tokens / tl}


def _decode_ab(model, tok, a, flag: str, sampling=(1.0, 50, 1.0), prompts: int = 4) -> dict:
    """The decode loop on HumanEval-length prompts (`prompts` x rows/prompts samples) with bf16 matmuls, `flag` off
    (baseline) and on (lever), timed interleaved; both arms' tokens compared. `sampling` = (temperature, top-k,
    top-p)."""
    from coopflow.stages.agents.decode import sample

    enc = tok(_humaneval_like(tok, a.rows, prompts), return_tensors="pt", padding=True)

    def run(on):
        torch.manual_seed(0)
        return sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, *sampling, None, tok.pad_token_id,
                      compute_dtype=torch.bfloat16, **{flag: on})

    tb, tl = interleave(lambda: run(False), lambda: run(True), a.repeats)
    x, y = run(False), run(True)
    return {"base_s": tb, "lever_s": tl, "prompt_tokens": enc["input_ids"].shape[1],
            "same_tokens": bool(torch.equal(x, y)), "token_agreement": round((x == y).float().mean().item(), 3)}


def lever_decode_fused(model, tok, a) -> dict:
    """sample(fused=True): F.rms_norm, top-p over the top-k survivors, with the runs' sampling settings (T 0.8,
    top-k 50, top-p 0.95)."""
    return _decode_ab(model, tok, a, "fused", (0.8, 50, 0.95))


def lever_prefill_shared(model, tok, a) -> dict:
    """sample(share_prefill=True): each distinct prompt prefilled once (4 prompts x rows/4 samples)."""
    return _decode_ab(model, tok, a, "share_prefill")


def _step_mode(model, tok, a, mode: str) -> dict:
    from coopflow.stages.agents.decode import sample

    enc = batch(tok, a.rows)

    def run(m):
        def go():
            torch.manual_seed(0)
            return sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 1.0, 50, 1.0, None,
                          tok.pad_token_id, step_mode=m)
        return go

    t0 = time.perf_counter()
    first = run(mode)()
    first_s = time.perf_counter() - t0
    tb, tl = interleave(run("dynamic"), run(mode), a.repeats)
    out = {"base_s": tb, "lever_s": tl, "first_call_s": round(first_s, 1),
           "same_tokens": bool(torch.equal(first, run("dynamic")()))}
    if mode == "compile":  # new weights, as after an update
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-4)
        t0 = time.perf_counter()
        run(mode)()
        out["after_new_weights_s"] = round(time.perf_counter() - t0, 1)
        with torch.no_grad():
            for p, v in zip(model.parameters(), saved):
                p.copy_(v)
    return out


def lever_decode_static(model, tok, a) -> dict:
    return _step_mode(model, tok, a, "static")


def lever_decode_compile(model, tok, a) -> dict:
    return _step_mode(model, tok, a, "compile")


def _humaneval_like(tok, rows: int, prompts: int = 4):
    body = ("def has_close_elements(numbers, threshold):\n    \"\"\" Check if in given list of numbers, are any two "
            "numbers closer to each other than given threshold.\n    >>> has_close_elements([1.0, 2.0], 0.5)\n"
            "    False\n    \"\"\"\n") * 3
    k = max(1, rows // prompts)
    return [tok.apply_chat_template([{"role": "user", "content": f"Task {i}. Complete this function:\n{body}"}],
                                    tokenize=False, add_generation_prompt=True)
            for i in range(prompts) for _ in range(k)]


def _sampled_batch(model, tok, a) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids) of 4 HumanEval-length prompts x rows/4 completions sampled with bf16 matmuls."""
    from coopflow.stages.agents.decode import sample

    enc = tok(_humaneval_like(tok, a.rows), return_tensors="pt", padding=True)
    torch.manual_seed(0)
    new = sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 1.0, 50, 1.0, tok.eos_token_id,
                 tok.pad_token_id, compute_dtype=torch.bfloat16)
    prompts = [[t for t, m in zip(r, mk) if m] for r, mk in zip(enc["input_ids"].tolist(),
                                                                enc["attention_mask"].tolist())]
    comps = [[t for t in r if t != tok.pad_token_id] or [tok.eos_token_id] for r in new.tolist()]
    return prompts, comps


def lever_loss_shared_prompts(model, tok, a) -> dict:
    from coopflow.stages.agents.logprobs import sequence_logprobs

    prompts, comps = _sampled_batch(model, tok, a)
    model.train()

    def run(share):
        def go():
            model.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = -sequence_logprobs(model, prompts, comps, tok.pad_token_id, share_prompts=share).mean()
            loss.backward()
            return loss.item()
        return go

    tb, tl = interleave(run(False), run(True), a.repeats)
    l0, l1 = run(False)(), run(True)()
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"base_s": tb, "lever_s": tl, "prompt_tokens": len(prompts[0]), "loss_per_row": round(l0, 4),
            "loss_shared": round(l1, 4)}


def _loss_inputs(model, tok, a):
    from coopflow.stages.agents.decode import sample

    enc = batch(tok, a.rows)
    torch.manual_seed(0)
    new = sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 1.0, 50, 1.0, tok.eos_token_id,
                 tok.pad_token_id)
    ids = torch.cat([enc["input_ids"], new], 1)
    mask = torch.cat([enc["attention_mask"], (new != tok.pad_token_id).long()], 1)
    return ids, mask, enc["input_ids"].shape[1]


def _loss(model, ids, mask, P):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, P - 1:-1].float()
    lp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, P:, None]).squeeze(2)
    return -(lp * mask[:, P:]).sum() / mask[:, P:].sum()


def lever_loss_bf16(model, tok, a) -> dict:
    ids, mask, P = _loss_inputs(model, tok, a)
    model.train()

    def base():
        model.zero_grad(set_to_none=True)
        _loss(model, ids, mask, P).backward()

    def lever():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(model, ids, mask, P)
        loss.backward()

    tb, tl = interleave(base, lever, a.repeats)
    with torch.no_grad():
        l32 = _loss(model, ids, mask, P).item()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            l16 = _loss(model, ids, mask, P).item()
    model.eval()
    return {"base_s": tb, "lever_s": tl, "loss_fp32": round(l32, 5), "loss_bf16": round(l16, 5)}


def lever_adamw_fused(model, tok, a) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    fused = torch.optim.AdamW(params, lr=1e-8, fused=True)
    plain = torch.optim.AdamW(params, lr=1e-8, foreach=True)
    tb, tl = interleave(plain.step, fused.step, a.repeats)
    for p in params:
        p.grad = None
    return {"base_s": tb, "lever_s": tl}


def lever_decode_rows(model, tok, a) -> dict:
    """Throughput of the decode loop (bf16 matmuls, fused, HumanEval-length prompts, T 0.8 / top-k 50 / top-p
    0.95) at `--rows` rows vs 4x as many: base_s / lever_s are seconds per 1000 decoded tokens, so the ratio is what
    a 4x larger decode batch would buy per token. A run's decode batch is rollout_buffer_size x K items (on-policy:
    the next update's items need this update's weights), so this measures how weight-read bound the step is, not a
    setting coopflow can change on its own."""
    from coopflow.stages.agents.decode import sample

    def per_k_tokens(rows):
        enc = tok(_humaneval_like(tok, rows), return_tensors="pt", padding=True)

        def go():
            torch.manual_seed(0)
            sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 0.8, 50, 0.95, None, tok.pad_token_id,
                   compute_dtype=torch.bfloat16)
        return go, rows * a.tokens / 1000

    (fb, kb), (fl, kl) = per_k_tokens(a.rows), per_k_tokens(4 * a.rows)
    tb, tl = interleave(fb, fl, a.repeats)
    return {"base_s": tb / kb, "lever_s": tl / kl, "rows_base": a.rows, "rows_lever": 4 * a.rows,
            "call_s_base": tb, "call_s_lever": tl}


def lever_loss_eager_attention(model, tok, a) -> dict:
    """The policy loss forward + backward (shared prompts, bf16 autocast, HumanEval-length prompts, 4 prompts x
    rows/4 completions) with attention as explicit matmul-softmax-matmul (`attn_implementation='eager'`) vs
    PyTorch's SDPA (coopflow's default): which attention backward is faster on this CPU."""
    from coopflow.stages.agents.logprobs import sequence_logprobs

    eager, _ = load_agent_with(a.model, "eager")
    prompts, comps = _sampled_batch(model, tok, a)

    def run(m):
        def go():
            m.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = -sequence_logprobs(m, prompts, comps, tok.pad_token_id).mean()
            loss.backward()
            return loss.item()
        return go

    model.train(), eager.train()
    tb, tl = interleave(run(model), run(eager), a.repeats)
    l0, l1 = run(model)(), run(eager)()
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"base_s": tb, "lever_s": tl, "loss_sdpa": round(l0, 4), "loss_eager": round(l1, 4)}


def _bf16_loss_pass(model, tok, prompts, comps) -> tuple[float, torch.Tensor]:
    """One policy loss forward + backward under a bf16 autocast (shared prompts): (the loss, every gradient flattened
    into one vector)."""
    from coopflow.stages.agents.logprobs import sequence_logprobs

    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = -sequence_logprobs(model, prompts, comps, tok.pad_token_id).mean()
    loss.backward()
    return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def lever_loss_wide_attention(model, tok, a) -> dict:
    """The policy loss forward + backward (shared prompts, bf16 autocast, HumanEval-length prompts, 4 prompts x
    rows/4 completions) with SDPA on float32 queries, keys and values (`attention.WIDE_SDPA`, coopflow's choice where
    bf16 attention is not fast) vs SDPA on the autocast's bf16 ones; loss and gradients compared."""
    from coopflow.stages.agents import attention as AT

    prompts, comps = _sampled_batch(model, tok, a)
    grads = {}

    def run(impl):
        def go():
            model.set_attn_implementation(impl)
            loss, grads[impl] = _bf16_loss_pass(model, tok, prompts, comps)
            return loss
        return go

    model.train()
    tb, tl = interleave(run("sdpa"), run(AT.register()), a.repeats)
    l0, l1 = run("sdpa")(), run(AT.WIDE_SDPA)()
    g0, g1 = grads["sdpa"], grads[AT.WIDE_SDPA]
    model.set_attn_implementation("sdpa")
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"base_s": tb, "lever_s": tl, "fast_bf16_attention": AT.fast_bf16_attention(torch.device("cpu")),
            "loss_bf16_attention": round(l0, 4), "loss_float32_attention": round(l1, 4),
            "grad_rel_diff": float((g0 - g1).norm() / g0.norm())}


def lever_loss_wide_gqa(model, tok, a) -> dict:
    """The policy loss forward + backward on `WIDE_SDPA` (float32 attention under a bf16 autocast, coopflow's choice on
    CPUs without AMX; shared prompts, HumanEval-length prompts, 4 prompts x rows/4 completions), its masked
    grouped-query attention handed to SDPA with `enable_gqa` (coopflow's path on a CPU) vs transformers' key/value
    copies per query head; loss and gradients compared."""
    from coopflow.stages.agents import attention as AT

    prompts, comps = _sampled_batch(model, tok, a)
    grouped, grads = AT._grouped_on_cpu, {}

    def run(native: bool):
        def go():
            AT._grouped_on_cpu = grouped if native else (lambda *args: False)
            loss, grads[native] = _bf16_loss_pass(model, tok, prompts, comps)
            return loss
        return go

    model.set_attn_implementation(AT.register())
    model.train()
    try:
        tb, tl = interleave(run(False), run(True), a.repeats)
        l0, l1 = run(False)(), run(True)()
    finally:
        AT._grouped_on_cpu = grouped
        model.set_attn_implementation("sdpa")
        model.zero_grad(set_to_none=True)
        model.eval()
    return {"base_s": tb, "lever_s": tl, "loss_copies": round(l0, 4), "loss_grouped": round(l1, 4),
            "grad_rel_diff": float((grads[False] - grads[True]).norm() / grads[False].norm())}


def lever_decode_tie_margin(model, tok, a) -> dict:
    """A bf16 decode (runs' sampling, HumanEval-length prompts, 2 prompts x rows/2 samples) whose top-k reads
    `TIE_MARGIN` values past the k-th (the ties at the k-th logit found in one pass over the vocabulary) vs a margin
    of 0 (every step with a tie counts the ties over the whole vocabulary and runs top-k again, as before), and one
    draw's `_survivors` alone on that many rows of 49k bf16-rounded logits."""
    from coopflow.stages.agents import decode as FD

    enc = tok(_humaneval_like(tok, a.rows, prompts=2), return_tensors="pt", padding=True)
    margin = FD.TIE_MARGIN

    def run(m):
        def go():
            FD.TIE_MARGIN = m
            torch.manual_seed(0)
            return FD.sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 0.8, 50, 0.95, None,
                             tok.pad_token_id, compute_dtype=torch.bfloat16)
        return go

    logits = (torch.randn(a.rows, model.config.vocab_size) * 3).bfloat16().float()

    def draws(m, n=200):
        FD.TIE_MARGIN = m
        return _timed(lambda: [FD._survivors(logits, 0.8, 50, 0.95) for _ in range(n)]) / n

    try:
        tb, tl = interleave(run(0), run(margin), a.repeats)
        sb, sl = min(draws(0) for _ in range(3)), min(draws(margin) for _ in range(3))
    finally:
        FD.TIE_MARGIN = margin
    return {"base_s": tb, "lever_s": tl, "survivors_ms_base": round(sb * 1e3, 3),
            "survivors_ms_lever": round(sl * 1e3, 3)}


def lever_decode_packed(model, tok, a) -> dict:
    return _decode_ab(model, tok, a, "packed", (0.8, 50, 0.95))


def lever_decode_pack_hint(model, tok, a) -> dict:
    """Decode weights packed for oneDNN with a 1-row batch hint (coopflow's `PACK_HINT`) vs a hint of the decode's own
    row count; the runs' sampling, HumanEval-length prompts; tokens compared (both are F.linear's products)."""
    from coopflow.stages.agents import decode as FD

    enc = tok(_humaneval_like(tok, a.rows), return_tensors="pt", padding=True)
    kept = FD.PACK_HINT

    def run(hint):
        def go():
            FD.PACK_HINT = hint
            try:
                torch.manual_seed(0)
                return FD.sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 0.8, 50, 0.95, None,
                                 tok.pad_token_id, compute_dtype=torch.bfloat16)
            finally:
                FD.PACK_HINT = kept
        return go

    tb, tl = interleave(run(a.rows), run(1), a.repeats)
    return {"base_s": tb, "lever_s": tl, "same_tokens": bool(torch.equal(run(a.rows)(), run(1)()))}


def lever_decode_fp32_packed(model, tok, a) -> dict:
    """A float32 decode loop (the weights' own dtype, as float32 runs decode) with its float32 matmul weights
    reordered once per call into oneDNN's blocked layout for --rows-row inputs (bf16 runs' are, for 1-row ones) vs
    F.linear; the runs' sampling, HumanEval-length prompts. Float32 runs must sample `generate`'s tokens, so what
    decides is whether the products are F.linear's: the largest difference over one step's matmuls and the share of
    sampled tokens that agree."""
    from coopflow.stages.agents import decode as FD

    enc = tok(_humaneval_like(tok, a.rows), return_tensors="pt", padding=True)
    kept, hint = FD.packs, FD.PACK_HINT

    def run(pack: bool):
        def go():
            FD.packs = (lambda dt, dev: dev.type == "cpu") if pack else kept
            FD.PACK_HINT = a.rows  # (float32: packed for the decode's own row count, the faster kernel measured)
            try:
                torch.manual_seed(0)
                return FD.sample(model, enc["input_ids"], enc["attention_mask"], a.tokens, 0.8, 50, 0.95, None,
                                 tok.pad_token_id, packed=True if pack else None)
            finally:
                FD.packs, FD.PACK_HINT = kept, hint
        return go

    tb, tl = interleave(run(False), run(True), a.repeats)
    lins = [FD._layer_weights(layer, torch.float32, torch.float32) for layer in model.model.layers]
    head = FD._Proj(model.lm_head.weight, None, torch.float32)
    H = model.config.hidden_size
    xh = torch.randn(a.rows, 1, H)

    def products():
        return [p(xh) for w in lins for p in (w["qkv"], w["o"], w["gu"])] + [head(xh[:, 0])]

    plain = products()
    FD.PACK_HINT = a.rows
    try:
        for proj in FD._projections(lins, head):
            proj.pack()
    finally:
        FD.PACK_HINT = hint
    packed = products()
    base, lever = run(False)(), run(True)()
    n = min(base.shape[1], lever.shape[1])
    diff = max((x - y).abs().max().item() for x, y in zip(plain, packed))
    return {"base_s": tb, "lever_s": tl, "max_product_diff": f"{diff:.1e}",
            "tokens_agree": round((base[:, :n] == lever[:, :n]).float().mean().item(), 3)}


def lever_decode_parts(model, tok, a) -> dict:
    """Where a bf16 decode step's time goes (runs' sampling, 2 prompts x rows/2 samples, the runs' shape): the step
    as it runs, then with its projection matmuls replaced by precomputed outputs of their shapes (the LM head's
    random, so the sampling does its usual work), then with the attention replaced too. The differences are the
    matmuls' and the attention's share; what is left is the norms, casts, rotary, cache writes and sampling. The
    tokens of the replaced runs mean nothing; only their time is read."""
    from coopflow.stages.agents import decode as FD

    enc = tok(_humaneval_like(tok, a.rows, prompts=2), return_tensors="pt", padding=True)
    T = a.tokens
    call_proj, attention, pack = FD._Proj.__call__, FD._shared_prompt_attention, FD._Proj.pack
    outs, widths = {}, {}

    def packed(self):  # remember each projection's output width before its plain weight goes
        widths[id(self)] = self.w.shape[0]
        pack(self)

    def canned(self, x):  # decode-step calls (one token per row) get a fixed output; the prefill runs as ever
        if not (x.dim() == 2 or x.shape[-2] == 1):
            return call_proj(self, x)
        n = self.w.shape[0] if self.packed is None else widths[id(self)]
        key = (tuple(x.shape[:-1]), n, x.dtype)
        if key not in outs:
            outs[key] = torch.randn(*x.shape[:-1], n).mul(3.0 if n > 10000 else 0.01).to(x.dtype)
        return outs[key]

    def per_step():
        def call(n):
            torch.manual_seed(0)
            FD.sample(model, enc["input_ids"], enc["attention_mask"], n, 0.8, 50, 0.95, None, tok.pad_token_id,
                      compute_dtype=torch.bfloat16)
        call(2)
        return min((_timed(lambda: call(T + 4)) - _timed(lambda: call(4))) / T for _ in range(a.repeats))

    FD._Proj.pack = packed
    try:
        full = per_step()
        FD._Proj.__call__ = canned
        no_mm = per_step()
        FD._shared_prompt_attention = lambda q, *_: q.clone()
        rest = per_step()
    finally:
        FD._Proj.__call__, FD._shared_prompt_attention, FD._Proj.pack = call_proj, attention, pack
    return {"base_s": full, "lever_s": rest, "step_ms": round(full * 1e3, 1),
            "matmuls_ms": round((full - no_mm) * 1e3, 1), "attention_ms": round((no_mm - rest) * 1e3, 1),
            "rest_ms": round(rest * 1e3, 1)}


def lever_decode_frozen(model, tok, a) -> dict:
    """torch.compile with weight freezing (max-autotune: inductor's own AMX/AVX512 GEMM kernels, weights packed at
    compile time) against oneDNN's packed kernels, on one decode step's projection matmuls (q/k/v, o, gate/up, down
    x layers and the LM head, `--rows` rows): ms and GB/s of weights each, the seconds the first compile takes and
    a compile after the weights changed (as after every update: frozen weights are constants of the compiled
    code), and the largest difference of the products."""
    import torch._inductor.config as inductor_config
    from torch import nn

    from coopflow.stages.agents import decode as FD

    inner = model.model
    mats = []
    for layer in inner.layers:
        at, m = layer.self_attn, layer.mlp
        mats += [torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]), at.o_proj.weight,
                 torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight]
    mats.append(model.lm_head.weight)
    wbytes = sum(w.numel() for w in mats) * 2

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = nn.ModuleList(nn.Linear(w.shape[1], w.shape[0], bias=False) for w in mats)
            with torch.no_grad():
                for lin, w in zip(self.lins, mats):
                    lin.weight.copy_(w)

        def forward(self, xh, xi):
            return [lin(xi if lin.in_features != xh.shape[-1] else xh) for lin in self.lins]

    step = Step().to(torch.bfloat16).eval()
    xh = torch.randn(a.rows, model.config.hidden_size).bfloat16()
    xi = torch.randn(a.rows, model.config.intermediate_size).bfloat16()
    projs = [FD._Proj(w, None, torch.bfloat16) for w in mats]
    for p in projs:
        p.pack()

    def packed():
        return [p(xi if p.packed.shape[-1] != xh.shape[-1] else xh) for p in projs]

    def best(fn):
        fn()
        return min(_timed(fn) for _ in range(a.repeats + 2))

    out = {}
    with torch.no_grad(), inductor_config.patch(freezing=True):
        t = time.perf_counter()
        compiled = torch.compile(step, mode="max-autotune")
        got = compiled(xh, xi)
        out["compile_s"] = round(time.perf_counter() - t, 1)
        diff = max((g.float() - r.float()).abs().max().item() for g, r in zip(got, packed()))
        tb, tl = best(packed), best(lambda: compiled(xh, xi))
        for lin in step.lins:  # the weights change, as after an update: the frozen code must be compiled again
            lin.weight.add_(1e-3)
        torch._dynamo.reset()
        t = time.perf_counter()
        torch.compile(step, mode="max-autotune")(xh, xi)
        out["recompile_s"] = round(time.perf_counter() - t, 1)
    out.update(packed_ms=round(tb * 1e3, 1), frozen_ms=round(tl * 1e3, 1), packed_GBps=round(wbytes / tb / 1e9, 1),
               frozen_GBps=round(wbytes / tl / 1e9, 1), max_abs_diff=diff)
    return {"base_s": tb, "lever_s": tl, **out}


def lever_decode_prefix_attention(model, tok, a) -> dict:
    """One decode step's attention (one layer, random bf16 data of the model's shapes; --rows rows = rows/4 prompts
    of 219 tokens x 4 samples, 64 tokens generated so far): the runs' SDPA over each row's whole cache (its prompt
    copied to every sample) vs shared-prefix attention: each prompt's keys read once for all its samples' queries
    (grouped per KV head), each row's own generated keys apart, the two merged by their log-sum-exp. Seconds per
    1000 calls; largest difference from a float32 reference of each."""
    cfg = model.config
    FA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    bf = torch.bfloat16
    K, nh, nkv = 4, cfg.num_attention_heads, cfg.num_key_value_heads
    hd, g, U, P, t = cfg.hidden_size // nh, nh // nkv, max(1, a.rows // 4), 219, 64
    B = U * K
    gen = torch.Generator().manual_seed(0)
    kp, vp = (torch.randn(U, nkv, P, hd, generator=gen).to(bf) for _ in range(2))
    kg, vg = (torch.randn(B, nkv, t, hd, generator=gen).to(bf) for _ in range(2))
    q = torch.randn(B, nh, 1, hd, generator=gen).to(bf)
    pad = torch.ones(U, P, dtype=torch.bool)
    pad[0, :30] = False  # one prompt left-padded
    inv = torch.arange(U).repeat_interleave(K)
    kc, vc = torch.cat([kp[inv], kg], 2), torch.cat([vp[inv], vg], 2)
    mask = torch.cat([pad[inv], torch.ones(B, t, dtype=torch.bool)], 1)[:, None, None, :]
    pmask = torch.zeros(U, 1, 1, P, dtype=bf).masked_fill_(~pad[:, None, None, :], float("-inf"))

    def whole():
        return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)

    def shared():
        qs = q.view(U, K, nkv, g, hd).transpose(1, 2).reshape(U, nkv, K * g, hd)
        o1, l1 = FA(qs, kp, vp, attn_mask=pmask)
        o1 = o1.view(U, nkv, K, g, hd).transpose(1, 2).reshape(B, nh, 1, hd)
        l1 = l1.view(U, nkv, K, g).transpose(1, 2).reshape(B, nh, 1, 1)
        o2, l2 = FA(q.view(B, nkv, g, hd), kg, vg)
        o2, l2 = o2.reshape(B, nh, 1, hd), l2.reshape(B, nh, 1, 1)
        m = torch.maximum(l1, l2)
        w1, w2 = (l1 - m).exp_(), (l2 - m).exp_()
        return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(bf)

    kk, vv = (x.float().repeat_interleave(g, 1) for x in (kc, vc))
    ref = ((q.float() @ kk.transpose(-1, -2)) / hd ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1) @ vv

    def thousand(fn):
        return lambda: [fn() for _ in range(1000)]

    tb, tl = interleave(thousand(whole), thousand(shared), a.repeats)
    return {"base_s": tb, "lever_s": tl, "err_whole": f"{(whole().float() - ref).abs().max().item():.1e}",
            "err_shared": f"{(shared().float() - ref).abs().max().item():.1e}"}


def lever_decode_narrow_cache(model, tok, a) -> dict:
    return _decode_ab(model, tok, a, "narrow_cache", (0.8, 50, 0.95))


def lever_decode_survivors(model, tok, a) -> dict:
    return _decode_ab(model, tok, a, "survivors", (0.8, 50, 0.95))


def lever_decode_shared_attention(model, tok, a) -> dict:
    """sample(shared_attention=True): each prompt's cached keys/values read once per step for its samples (the
    prompt part and each row's own part under one softmax) vs SDPA over every row's copy; 2 prompts x rows/2
    samples, the runs' shape (rollout_buffer_size 2)."""
    return _decode_ab(model, tok, a, "shared_attention", (0.8, 50, 0.95), prompts=2)


def lever_loss_chunked_lse(model, tok, a) -> dict:
    return _loss_lse_blocks(model, tok, a, None, "auto")


def _loss_lse_blocks(model, tok, a, base, lever) -> dict:
    """The shared-prompt loss forward + backward (bf16 autocast) with `token_logprobs(chunk=base)` vs
    `chunk=lever`, interleaved; loss and the last gradient compared."""
    import functools

    from coopflow.stages.agents import logprobs as LP

    prompts, comps = _sampled_batch(model, tok, a)
    chunked = LP.token_logprobs
    model.train()

    def run(chunk):
        def go():
            LP.token_logprobs = functools.partial(chunked, chunk=chunk)
            try:
                model.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = -LP.sequence_logprobs(model, prompts, comps, tok.pad_token_id).mean()
                loss.backward()
                return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None][-1]
            finally:
                LP.token_logprobs = chunked
        return go

    tb, tl = interleave(run(base), run(lever), a.repeats)
    (l0, g0), (l1, g1) = run(base)(), run(lever)()
    model.zero_grad(set_to_none=True)
    model.eval()
    return {"base_s": tb, "lever_s": tl, "same_loss": l0 == l1, "same_last_grad": bool(torch.equal(g0, g1))}


def lever_loss_lse_block(model, tok, a) -> dict:
    """loss_chunked_lse's block size: 64 positions per float32 block (before) vs `BLOCK_FLOATS` values (the default:
    10 positions of SmolLM2's 49k vocabulary)."""
    return _loss_lse_blocks(model, tok, a, 64, "auto")


def lever_decode_floor(model, tok, a) -> dict:
    """A decode step (bf16 matmuls, HumanEval-length prompts, runs' sampling) against its floor: the larger of the
    time to read its matmul weights once (the read bandwidth measured here) and the time its matmul FLOPs take at
    one thread's dense matmul peak (measured here). Per rows in (--rows, 2x --rows): the step with every bf16 lever
    on and off, the matmuls alone (the same packed weights, one step's inputs), and the float32 step (the weights'
    own dtype) against its floor (twice the bytes, the float32 peak)."""
    import flops

    from coopflow.stages.agents import decode as FD

    inner = model.model
    weights = [lin.weight for layer in inner.layers for lin in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)] + [model.lm_head.weight]
    wbytes = sum(w.numel() for w in weights) * 2  # bf16
    bw = flops.read_bandwidth(wbytes)
    read_ms = wbytes / (bw["read"] * 1e9) * 1e3
    peak = {dt: flops.matmul_peak(dt, threads=1) for dt in ("bfloat16", "float32")}  # GFLOP/s, one thread
    out = {"weight_MB": round(wbytes / 1e6, 1), "read_GBps": round(bw["read"], 1), "copy_GBps": round(bw["copy"], 1),
           "read_floor_ms": round(read_ms, 1), "peak_bf16_GFLOPs": round(peak["bfloat16"]),
           "peak_fp32_GFLOPs": round(peak["float32"])}
    T = a.tokens
    for rows in (a.rows, 2 * a.rows):
        enc = tok(_humaneval_like(tok, rows), return_tensors="pt", padding=True)
        gflop = 2 * rows * wbytes / 2 / 1e9  # the step's matmul FLOPs: a multiply-add per weight per row
        floor_ms = max(read_ms, gflop / peak["bfloat16"] * 1e3)
        floor32_ms = max(2 * read_ms, gflop / peak["float32"] * 1e3)

        def per_step(compute_dtype=torch.bfloat16, **levers):
            def call(n):
                torch.manual_seed(0)
                FD.sample(model, enc["input_ids"], enc["attention_mask"], n, 0.8, 50, 0.95, None, tok.pad_token_id,
                          compute_dtype=compute_dtype, **levers)
            call(2)
            return lambda: (_timed(lambda: call(T + 4)) - _timed(lambda: call(4))) / T

        on, off = per_step(), per_step(packed=False, narrow_cache=False, survivors=False)
        wide = per_step(compute_dtype=None)  # float32 matmuls: the weights' own dtype, twice the bytes
        steps_off, steps_on, steps_wide = [], [], []
        for _ in range(a.repeats):  # interleaved, seconds per step
            steps_off.append(off())
            steps_on.append(on())
            steps_wide.append(wide())
        t_off, t_on, t_wide = (statistics.median(x) for x in (steps_off, steps_on, steps_wide))
        pack = FD.packs(torch.bfloat16, torch.device("cpu"))
        lins = [FD._layer_weights(layer, torch.bfloat16, torch.float32) for layer in inner.layers]
        head = FD._Proj(model.lm_head.weight, None, torch.bfloat16)
        for proj in FD._projections(lins, head) if pack else ():
            proj.pack()
        H, inter = model.config.hidden_size, model.config.intermediate_size
        xh, xi = torch.randn(rows, 1, H).bfloat16(), torch.randn(rows, 1, inter).bfloat16()

        def matmuls():
            for w in lins:
                w["qkv"](xh), w["o"](xh), w["gu"](xh), w["d"](xi)
            head(xh[:, 0])
        matmuls()
        mm = min(_timed(matmuls) for _ in range(a.repeats + 2))
        out[f"rows{rows}"] = {"compute_floor_ms": round(gflop / peak["bfloat16"] * 1e3, 1),
                              "floor_ms": round(floor_ms, 1), "float32_floor_ms": round(floor32_ms, 1),
                              "step_ms_levers_off": round(t_off * 1e3, 1), "step_ms": round(t_on * 1e3, 1),
                              "matmuls_ms": round(mm * 1e3, 1), "weights_GBps": round(wbytes / t_on / 1e9, 1),
                              "matmul_GBps": round(wbytes / mm / 1e9, 1),
                              "step_x_floor": round(t_on * 1e3 / floor_ms, 2),
                              "matmuls_x_floor": round(mm * 1e3 / floor_ms, 2),
                              "float32_step_ms": round(t_wide * 1e3, 1),
                              "float32_step_x_floor": round(t_wide * 1e3 / floor32_ms, 2)}
        out.setdefault("base_s", t_off)
        out.setdefault("lever_s", t_on)
    return out


def load_agent_with(model_dir: str, attention: str):
    from coopflow.stages.agents.models import load_agent

    return load_agent(model_dir, "float32", attention, "cpu")


LEVERS = {"decode_bf16": lever_decode_bf16, "decode_fused": lever_decode_fused, "prefill_shared": lever_prefill_shared,
          "loss_shared_prompts": lever_loss_shared_prompts, "decode_static": lever_decode_static,
          "decode_compile": lever_decode_compile, "loss_bf16": lever_loss_bf16, "adamw_fused": lever_adamw_fused,
          "decode_rows": lever_decode_rows, "loss_eager_attention": lever_loss_eager_attention,
          "decode_packed": lever_decode_packed, "decode_narrow_cache": lever_decode_narrow_cache,
          "decode_survivors": lever_decode_survivors, "loss_lse_block": lever_loss_lse_block,
          "decode_floor": lever_decode_floor,
          "decode_pack_hint": lever_decode_pack_hint, "decode_frozen": lever_decode_frozen,
          "decode_prefix_attention": lever_decode_prefix_attention,
          "loss_chunked_lse": lever_loss_chunked_lse, "loss_wide_attention": lever_loss_wide_attention,
          "decode_shared_attention": lever_decode_shared_attention, "decode_fp32_packed": lever_decode_fp32_packed,
          "decode_parts": lever_decode_parts, "loss_wide_gqa": lever_loss_wide_gqa,
          "decode_tie_margin": lever_decode_tie_margin}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(REPO / ".bench" / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, default=8, help="sequences per batch (items x K)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load(a.model)
    print(f"model {a.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M params; rows {a.rows}, "
          f"tokens {a.tokens}, threads {a.threads}, repeats {a.repeats}")
    for name in a.levers:
        r = LEVERS[name](model, tok, a)
        extra = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k not in ("base_s", "lever_s")}
        print(f"{name:>12}: base {r['base_s']:.2f} s, lever {r['lever_s']:.2f} s -> {r['base_s'] / r['lever_s']:.2f}x  "
              f"{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
