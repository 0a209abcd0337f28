"""The KV-cache sampling loop draws exactly the tokens `generate` draws for the same seed."""

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig

from coopflow.stages.agents import decode as FD
from coopflow.stages.rollout.generate import SamplingConfig, generate_for_agent
from coopflow.stages.agents.models import load_agent

PROMPTS = ["Once upon a time", "A dog", "the quick brown fox jumps over the lazy", "Hi"]


def _both(model, tok, top_k, top_p, temperature, eos, tokens=24, k=4, seed=3):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, am = enc.input_ids.repeat_interleave(k, 0), enc.attention_mask.repeat_interleave(k, 0)
    gc = GenerationConfig(do_sample=True, max_new_tokens=tokens, temperature=temperature, top_p=top_p,
                          top_k=top_k, pad_token_id=tok.pad_token_id, eos_token_id=eos, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)[:, ids.shape[1]:]
    torch.manual_seed(seed)
    mine = FD.sample(model, ids, am, tokens, temperature, top_k, top_p, eos, tok.pad_token_id)
    return ref, mine


@pytest.mark.parametrize("top_k,top_p,temperature", [(50, 1.0, 1.0), (50, 0.6, 0.6), (0, 0.9, 0.7), (1, 1.0, 1.0)])
def test_same_tokens_as_generate_with_left_padding_and_every_warper(tiny_model_dir, top_k, top_p, temperature):
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    assert FD.supports(model)
    ref, mine = _both(model, tok, top_k, top_p, temperature, tok.eos_token_id)
    assert torch.equal(ref, mine)


def test_early_stop_and_pads_after_eos_match_generate(tiny_model_dir):
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    # make a frequently sampled token the EOS so sequences finish at different steps
    ref0, _ = _both(model, tok, 50, 1.0, 1.0, tok.eos_token_id)
    eos = int(torch.mode(ref0[:, :4].flatten()).values)
    ref, mine = _both(model, tok, 50, 1.0, 1.0, eos, tokens=40)
    finished = (ref == eos).any(1)
    assert finished.any() and torch.equal(ref, mine)
    first = (ref == eos).int().argmax(1)
    for r in torch.nonzero(finished).flatten().tolist():  # everything after the first EOS is pad
        assert (mine[r, first[r] + 1:] == tok.pad_token_id).all()


def test_llama_layout_without_qkv_bias_and_unsupported_models_fall_back(tiny_model_dir):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).eval()
    assert FD.supports(llama)
    ref, mine = _both(llama, tok, 50, 0.9, 0.8, tok.eos_token_id)
    assert torch.equal(ref, mine)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2)).eval()
    assert not FD.supports(gpt2)
    # the rollout stage uses generate for it, and for any model when backend is 'hf'
    sampling = SamplingConfig(2, 6, 1.0, 1.0, 50)
    rows = generate_for_agent(gpt2, tok, PROMPTS[:2], 2, sampling, seed=1)
    assert len(rows) == 4 and all(len(r[1]) <= 6 for r in rows)


def test_rollout_stage_rows_are_the_same_with_either_backend(tiny_model_dir):
    model, tok = load_agent(tiny_model_dir)
    auto = generate_for_agent(model, tok, PROMPTS, 3, SamplingConfig(3, 12, 0.8, 0.9, 50, "auto"), seed=7)
    hf = generate_for_agent(model, tok, PROMPTS, 3, SamplingConfig(3, 12, 0.8, 0.9, 50, "hf"), seed=7)
    assert auto == hf


def test_bf16_matmuls_on_float32_weights_stay_close_to_float32(tiny_model_dir):
    """`agents.compute_dtype: bfloat16`: the projection matmuls run in bf16, and the KV cache and attention too where
    that is faster (residual stream, norms, rotary stay float32): the weights are untouched, greedy continuations
    agree with float32 either way, and compute_dtype=float32 is the float32 path exactly."""
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, am = enc.input_ids, enc.attention_mask
    g32 = FD.sample(model, ids, am, 8, 1.0, 1, 1.0, None, tok.pad_token_id)
    for narrow in (False, True):
        g16 = FD.sample(model, ids, am, 8, 1.0, 1, 1.0, None, tok.pad_token_id, compute_dtype=torch.bfloat16,
                        narrow_cache=narrow)
        assert (g32 == g16).float().mean() >= 0.75
    assert next(model.parameters()).dtype == torch.float32
    torch.manual_seed(4)
    a = FD.sample(model, ids, am, 12, 0.8, 50, 0.95, tok.eos_token_id, tok.pad_token_id, compute_dtype=torch.float32)
    torch.manual_seed(4)
    b = FD.sample(model, ids, am, 12, 0.8, 50, 0.95, tok.eos_token_id, tok.pad_token_id)
    assert torch.equal(a, b)


def _sampling(cfg):
    from coopflow.stages.planning.settings import RunSettings

    settings = RunSettings.of(cfg)
    return SamplingConfig.of(settings.rollouts, settings.execution, 2)


def test_compute_dtype_setting_resolves_per_machine_and_keys_stay(monkeypatch, tmp_path):
    from coopflow.schemas.config import validate_config
    from tests.conftest import small_config

    base = _sampling(validate_config(small_config(tmp_path)))
    assert base.compute_dtype == "model"
    monkeypatch.setattr(FD, "native_bf16", lambda device="cpu": True)
    auto_cfg = validate_config(small_config(tmp_path, agents={"agent_model": "tiny", "num_agents": 2,
                                                              "compute_dtype": "auto"}))
    assert _sampling(auto_cfg).compute_dtype == "bfloat16"
    # the start key holds the resolved dtype: a machine that resolves `auto` otherwise computes other keys
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning.context import resolve_sources

    store = ArtifactStore(tmp_path / "store")
    assert resolve_sources(auto_cfg, store)[1]["compute_dtype"] == "bfloat16"
    monkeypatch.setattr(FD, "native_bf16", lambda device="cpu": False)
    assert resolve_sources(auto_cfg, store)[1]["compute_dtype"] == "model"
    monkeypatch.setattr(FD, "native_bf16", lambda device="cpu": False)
    assert FD.resolve_compute_dtype("auto", "cpu") == "model" and FD.resolve_compute_dtype("bfloat16", "cpu") == "bfloat16"


def test_shared_prompts_are_prefilled_once_and_sample_the_same_tokens(tiny_model_dir, monkeypatch):
    """K samples of a prompt (here in any order, not adjacent) share one prefill: the prefill forward sees the
    distinct prompts only, and the tokens equal `generate`'s and the per-row prefill's for the same seed."""
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    order = torch.tensor([2, 0, 1, 2, 3, 0, 2, 1, 3])
    ids, am = enc.input_ids[order], enc.attention_mask[order]
    rep, inverse = FD._distinct_rows(ids, am)
    assert len(rep) == 4 and torch.equal(ids[rep][inverse], ids)
    assert FD._distinct_rows(enc.input_ids, enc.attention_mask) == (None, None)
    gc = GenerationConfig(do_sample=True, max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=50,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(5)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)[:, ids.shape[1]:]
    seen = []
    real_embedding = FD.F.embedding
    monkeypatch.setattr(FD.F, "embedding", lambda x, w: seen.append(tuple(x.shape)) or real_embedding(x, w))
    torch.manual_seed(5)
    shared = FD.sample(model, ids, am, 16, 0.9, 50, 0.95, tok.eos_token_id, tok.pad_token_id)
    assert seen[0] == (4, ids.shape[1]) and all(s[0] == len(order) for s in seen[1:])
    torch.manual_seed(5)
    per_row = FD.sample(model, ids, am, 16, 0.9, 50, 0.95, tok.eos_token_id, tok.pad_token_id, share_prefill=False)
    assert torch.equal(shared, ref) and torch.equal(per_row, ref)


def test_static_step_mode_samples_the_same_tokens_as_the_dynamic_one(tiny_model_dir):
    """The static-shape decode step (the one CUDA graphs replay: attention over the whole cache, masked to its
    filled slots, the slot given as a tensor) draws the same tokens as the growing-cache step, also with EOS early
    stops and shared prefills; 'cuda_graph' needs a CUDA device and unknown modes are refused by name."""
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, am = enc.input_ids.repeat_interleave(3, 0), enc.attention_mask.repeat_interleave(3, 0)
    ref0, _ = _both(model, tok, 50, 1.0, 1.0, tok.eos_token_id)
    eos = int(torch.mode(ref0[:, :4].flatten()).values)
    outs = {}
    for mode in ("dynamic", "static", "auto"):
        torch.manual_seed(11)
        outs[mode] = FD.sample(model, ids, am, 30, 0.9, 50, 0.95, eos, tok.pad_token_id, step_mode=mode)
    assert (outs["dynamic"] == eos).any(1).any()
    assert torch.equal(outs["static"], outs["dynamic"]) and torch.equal(outs["auto"], outs["dynamic"])
    with pytest.raises(ValueError, match="needs a CUDA device"):
        FD.sample(model, ids, am, 4, 1.0, 50, 1.0, None, tok.pad_token_id, step_mode="cuda_graph")
    with pytest.raises(ValueError, match="step_mode 'fast'"):
        FD.sample(model, ids, am, 4, 1.0, 50, 1.0, None, tok.pad_token_id, step_mode="fast")


@pytest.mark.slow
def test_compiled_static_step_samples_the_same_tokens(tiny_model_dir):
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    torch.manual_seed(2)
    a = FD.sample(model, enc.input_ids, enc.attention_mask, 8, 1.0, 50, 1.0, None, tok.pad_token_id)
    torch.manual_seed(2)
    b = FD.sample(model, enc.input_ids, enc.attention_mask, 8, 1.0, 50, 1.0, None, tok.pad_token_id,
                  step_mode="compile")
    assert torch.equal(a, b)


def test_decode_step_setting_reaches_the_loop_and_never_the_keys(tiny_model_dir, tmp_path):
    """agents.decode_step: validated by name, carried to the loop (a static step draws the same rollout rows), and
    left out of the keys (every mode samples the same tokens)."""
    from dataclasses import replace

    from coopflow.schemas.config import ConfigError, validate_config
    from tests.conftest import small_config

    base = small_config(tmp_path)
    from coopflow.stages.planning.settings import RunSettings

    default_cfg = validate_config(base)
    static_cfg = validate_config({**base, "agents": {**base["agents"], "decode_step": "static"}})
    assert _sampling(default_cfg).decode_step == "auto" and _sampling(static_cfg).decode_step == "static"
    assert RunSettings.of(static_cfg).declared == RunSettings.of(default_cfg).declared  # never in a key
    with pytest.raises((ConfigError, ValueError), match="decode_step"):
        validate_config({**base, "agents": {**base["agents"], "decode_step": "graphs"}})
    model, tok = load_agent(tiny_model_dir)
    s = SamplingConfig(3, 12, 0.8, 0.9, 50)
    rows = generate_for_agent(model, tok, PROMPTS, 3, s, seed=7)
    assert generate_for_agent(model, tok, PROMPTS, 3, replace(s, decode_step="static"), seed=7) == rows


@pytest.mark.parametrize("top_k,top_p,temperature", [(50, 0.95, 0.8), (5, 0.5, 1.0), (3, 0.999, 1.3)])
def test_top_p_over_the_top_k_survivors_masks_what_the_full_sort_masks(top_k, top_p, temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=g) * 3
    logits[1, :12] = logits[1].max() + 1  # more tied tokens at the top than top_k (3, 5) keeps: all of them survive
    logits[2, 100:110] = torch.topk(logits[2], top_k).values[-1]  # ties at the k-th logit: every tie survives
    logits[3] = logits[3].round()  # coarse logits (as bf16 ones are) tie everywhere
    full = FD._warp(logits.clone(), temperature, top_k, top_p, subset=False)
    sub = FD._warp(logits.clone(), temperature, top_k, top_p, subset=True)
    kept_full, kept_sub = full > float("-inf"), sub > float("-inf")
    # the same logits where both keep a token; they may differ only among tokens tied at the top-p edge
    assert torch.equal(full[kept_full & kept_sub], sub[kept_full & kept_sub])
    for r in range(len(logits)):
        diff = (kept_full[r] ^ kept_sub[r]).nonzero().flatten()
        if len(diff):
            edge = logits[r][kept_full[r] | kept_sub[r]].min()
            assert (logits[r][diff] == edge).all(), f"row {r}: only tokens tied at the edge may differ"
            assert kept_full[r].sum() == kept_sub[r].sum()
    assert torch.equal(kept_full[[0, 4, 5]], kept_sub[[0, 4, 5]])  # untied rows: the very same tokens kept


def test_prepacked_bf16_weights_give_the_same_products_as_plain_ones(tiny_model_dir):
    """Weights reordered once for oneDNN's decode-size kernels (`packed`) multiply to the very same bf16 numbers as
    F.linear at decode sizes (5 x 3 rows here); a bias is added after rounding rather than before (one bf16 rounding
    step apart at most), so a bf16 decode samples nearly the same tokens packed or not (where this CPU packs)."""
    if not FD.packs(torch.bfloat16, torch.device("cpu")):
        pytest.skip("this CPU has no oneDNN bf16 matmuls to pack for")
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 48, generator=g), torch.randn(96, generator=g)
    x = torch.randn(5, 3, 48, generator=g).bfloat16()
    for bias in (None, b):
        plain = FD._Proj(w, bias, torch.bfloat16)(x)
        proj = FD._Proj(w, bias, torch.bfloat16)
        proj.pack()
        assert proj.w is None  # the plain copy is dropped
        packed = proj(x)
        if bias is None:
            assert torch.equal(packed, plain)
        else:
            ulp = plain.float().abs().clamp(min=1e-3) * 2 ** -7
            assert ((packed.float() - plain.float()).abs() <= ulp).all()
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    outs = []
    for pack in (False, True):
        torch.manual_seed(9)
        outs.append(FD.sample(model, enc.input_ids, enc.attention_mask, 12, 0.8, 50, 0.95, None, tok.pad_token_id,
                              compute_dtype=torch.bfloat16, packed=pack))
    assert (outs[0] == outs[1]).float().mean() >= 0.75


def test_a_draw_over_the_survivors_has_the_vocabulary_draws_distribution():
    """`survivors`: tokens drawn from each row's top-k/top-p survivors only follow the probabilities of the warped
    vocabulary's softmax (the fused decode's vocabulary draw; see the test above for its top-p edge ties), ties at
    the k-th logit included; never a token the warpers mask."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 400, generator=g) * 2
    logits[1, 10:20] = torch.topk(logits[1], 8).values[-1]  # ties at the k-th logit: all of them survive
    expected = FD._warp(logits.clone(), 0.8, 8, 0.9).softmax(-1)
    torch.manual_seed(0)
    n = 20000
    draws = torch.stack([FD._draw(logits, 0.8, 8, 0.9, True, True) for _ in range(n)])  # [n, 3]
    for r in range(3):
        freq = torch.bincount(draws[:, r], minlength=400).float() / n
        assert (freq[expected[r] == 0] == 0).all(), f"row {r}: a masked token was drawn"
        assert (freq - expected[r]).abs().max() < 0.015, f"row {r}: frequencies off the warped probabilities"
    # without top-k there are no survivors to draw from: the vocabulary draw, `generate`'s tokens
    torch.manual_seed(3)
    a = FD._draw(logits, 0.8, None, 0.9, True, True)
    torch.manual_seed(3)
    assert torch.equal(a, torch.multinomial(FD._warp(logits, 0.8, None, 0.9).softmax(-1), 1).squeeze(1))


def test_packed_true_where_weights_cannot_be_packed_is_refused(tiny_model_dir):
    """`packed=True` asks for oneDNN's bf16 layout: with float32 compute (or off a bf16 CPU) it is one clear error
    instead of a oneDNN call on weights it cannot take."""
    model, tok = load_agent(tiny_model_dir)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="cannot be pre-packed"):
        FD.sample(model, enc.input_ids, enc.attention_mask, 4, 0.8, 50, 0.95, None, tok.pad_token_id,
                  compute_dtype=torch.float32, packed=True)


def test_shared_prompt_attention_equals_sdpa_over_each_rows_whole_cache():
    """Attention with each prompt's keys/values read once for its rows (grouped-query heads, pads in one prompt)
    gives what SDPA gives over every row's own copy of its prompt's cache followed by its own tokens."""
    g = torch.Generator().manual_seed(0)
    U, r, H, KV, P, t, hd = 3, 2, 6, 2, 7, 4, 8
    B = U * r
    kp, vp = torch.randn(U, KV, P, hd, generator=g), torch.randn(U, KV, P, hd, generator=g)
    ko, vo = torch.randn(B, KV, t, hd, generator=g), torch.randn(B, KV, t, hd, generator=g)
    q = torch.randn(B, H, 1, hd, generator=g)
    ok = torch.ones(U, P, dtype=torch.bool)
    ok[1, :3] = False  # a left-padded prompt
    bias = torch.zeros(U, 1, 1, P).masked_fill(~ok[:, None, None, :], float("-inf"))
    rows = torch.arange(U).repeat_interleave(r)
    k, v = torch.cat([kp[rows], ko], 2), torch.cat([vp[rows], vo], 2)
    mask = torch.cat([ok[rows], torch.ones(B, t, dtype=torch.bool)], 1)[:, None, None, :]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = FD._shared_prompt_attention(q, kp, vp, bias, ko, vo)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-6, rtol=1e-5)


def test_shared_attention_samples_the_same_tokens_and_runs_where_it_is_the_default(tiny_model_dir, monkeypatch):
    """`shared_attention` draws the same float32 tokens as attention over every row's whole cache (rows in blocks
    of K per prompt, as rollouts ask; rows in another order fall back to the whole cache); by default it runs for bf16
    matmuls where the KV cache stays float32 (a CPU whose bf16 attention is the slower one), not in float32 runs."""
    model, tok = load_agent(tiny_model_dir)
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    calls = []
    real = FD._shared_prompt_attention
    monkeypatch.setattr(FD, "_shared_prompt_attention", lambda *a: calls.append(1) or real(*a))

    def draw(order, **kw):
        torch.manual_seed(4)
        calls.clear()
        out = FD.sample(model, enc.input_ids[order], enc.attention_mask[order], 20, 0.9, 50, 0.95, tok.eos_token_id,
                        tok.pad_token_id, **kw)
        return out, len(calls)

    blocks = torch.arange(4).repeat_interleave(3)
    whole, n = draw(blocks, shared_attention=False)
    assert n == 0
    shared, n = draw(blocks, shared_attention=True)
    assert n > 0 and torch.equal(shared, whole)
    scattered = torch.tensor([2, 0, 1, 2, 3, 0, 2, 1, 3, 0, 1, 3])
    assert draw(scattered, shared_attention=True)[1] == 0  # not in blocks: the whole cache
    assert draw(blocks)[1] == 0  # float32: `generate`'s attention
    for fast, expect in ((False, True), (True, False)):
        monkeypatch.setattr(FD, "fast_bf16_attention", lambda dev, fast=fast: fast)
        assert (draw(blocks, compute_dtype=torch.bfloat16)[1] > 0) == expect


def test_the_survivors_are_every_token_at_or_above_the_kth_logit_ties_within_and_past_the_margin():
    """`_survivors` finds the ties at the k-th logit in its first top-k pass where `TIE_MARGIN` holds them, and
    counts them over the whole vocabulary where it may not: either way each row's survivors are exactly the tokens
    whose logit is at least the k-th largest, with their logits, ascending, -inf padding the rows that keep fewer."""
    g = torch.Generator().manual_seed(0)
    k = 10
    logits = torch.randn(4, 300, generator=g) * 3

    def kth(row):  # the row's k-th largest logit
        return torch.topk(row, k).values[-1]

    logits[1, 200:205] = kth(logits[1])  # 5 ties past the k-th: inside the margin
    logits[2, 100:100 + FD.TIE_MARGIN + 6] = kth(logits[2])  # more ties than the margin: the whole-vocabulary count
    logits[3, 50:50 + FD.TIE_MARGIN] = kth(logits[3])  # exactly the margin's worth
    for rows in ([0], [0, 1], [0, 1, 3], [0, 1, 2, 3]):
        x = logits[rows]
        values, ids = FD._survivors(x, 1.0, k, 1.0)
        wants = [(row >= kth(row)).nonzero().flatten() for row in x]  # every token at or above the k-th
        for i, want in enumerate(wants):
            kept = values[i] > float("-inf")
            assert sorted(ids[i][kept].tolist()) == want.tolist()
            assert torch.equal(values[i][kept], x[i][ids[i][kept]])
            assert bool((values[i][kept].diff() >= 0).all())  # ascending, as top-p's cumulative sum wants
        assert values.shape[-1] == max(len(want) for want in wants)
