"""Speed settings of issue 23. `agents.compute_dtype`: bf16 matmuls for decoding and the loss passes on float32 weights — the
setting reaches every agent wherever it lives, enters the keys only when set, and the bf16 loss stays close to
the float32 one (a numerics check, not a speed test: speed is in bench/bench_levers.py).
`trainer.loss_chunk_tokens`: the loss in length-sorted chunks trains the one-pass weights."""

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coopflow.stages.agents.spec import AgentSpec
from coopflow.schemas.config import validate_config
from coopflow.stages.agents import decode as FD
from coopflow.flows.driver import run_inline
from tests.conftest import small_config

BF16 = {"agent_model": "tiny", "num_agents": 2, "compute_dtype": "bfloat16"}


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return {f"{a.name}.{k}": v for a in sorted(ckpt.glob("agent_*")) for k, v in load_file(a / "model.safetensors").items()}


def test_bf16_loss_is_close_to_float32_and_leaves_weights_float32(tiny_model_dir):
    from coopflow.stages.agents.models import load_agent_state
    from coopflow.stages.agents.state import set_compute_dtype
    from coopflow.stages.update.policy_gradient import policy_loss

    agent = load_agent_state(AgentSpec(str(tiny_model_dir), 1e-3))
    tok = agent.tokenizer
    node = [{"prompt_ids": tok("the moon is")["input_ids"], "completion_ids": tok(" a big red star .")["input_ids"],
             "advantage": a} for a in (1.0, -0.5)]
    loss32, _ = policy_loss(agent.model, [node], tok.pad_token_id)
    set_compute_dtype(agent, "bfloat16")
    with agent.autocast():
        loss16, _ = policy_loss(agent.model, [node], tok.pad_token_id)
    loss16.backward()
    assert loss16.dtype == torch.float32 and abs(loss16.item() - loss32.item()) <= 0.02 * abs(loss32.item()) + 1e-3
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in agent.model.parameters())
    set_compute_dtype(agent, "model")
    assert not isinstance(agent.autocast(), torch.autocast)


def test_the_setting_reaches_worker_processes_and_enters_the_keys(tmp_path, pinned_threads):
    local = run_inline(validate_config(small_config(tmp_path / "local", agents=BF16)))
    mp = run_inline(validate_config(small_config(tmp_path / "mp", agents=BF16, trainer={
        **small_config(tmp_path)["trainer"], "parallel_training": "mp", "agent_devices": ["cpu", "cpu"]})))
    assert Path(mp["checkpoint"]).name == Path(local["checkpoint"]).name
    wl, wm = _weights(Path(local["checkpoint"])), _weights(Path(mp["checkpoint"]))
    assert all(torch.allclose(wl[k], wm[k], atol=1e-6) for k in wl)
    plain = run_inline(validate_config(small_config(tmp_path / "plain")))
    assert Path(plain["checkpoint"]).name != Path(local["checkpoint"]).name  # bf16 runs never reuse float32 work
    assert not all(torch.equal(wl[k], v) for k, v in _weights(Path(plain["checkpoint"])).items())


def test_auto_is_bf16_only_where_the_device_has_native_bf16(monkeypatch):
    monkeypatch.setattr(FD, "native_bf16", lambda device="cpu": False)
    assert FD.resolve_compute_dtype("auto", "cpu") == "model"
    monkeypatch.setattr(FD, "native_bf16", lambda device="cpu": True)
    assert FD.resolve_compute_dtype("auto", "cpu") == "bfloat16"
    assert FD.resolve_compute_dtype("float16", "cpu") == "float16"


def test_chunk_rows_cover_every_row_within_the_token_cap():
    from coopflow.stages.update.policy_gradient import chunk_rows

    rows = [([1] * p, [2] * c, 1.0, 0.1) for p, c in [(5, 3), (2, 1), (9, 9), (4, 4), (30, 10), (3, 3)]]
    chunks = chunk_rows(rows, 20)
    assert sorted(map(id, (r for ch in chunks for r in ch))) == sorted(map(id, rows))  # every row, once
    for ch in chunks:  # padded tokens: rows x (longest prompt + longest completion)
        padded = len(ch) * (max(len(r[0]) for r in ch) + max(len(r[1]) for r in ch))
        assert padded <= 20 or len(ch) == 1  # a row longer than the cap goes alone
    assert chunk_rows(rows, None) == [rows]
    assert chunk_rows(rows, 10_000) == [rows]  # everything fits: one pass, the rows in their own order


def test_shared_prompts_count_once_so_a_node_stays_in_one_chunk():
    """Where the model runs a node's prompt once for its K completions, a chunk holds distinct prompts × longest
    prompt + rows × longest completion, and chunks are cut between prompts: two nodes of 4 completions (prompt 40,
    completions 128) are 552 tokens each, 1104 together, so a 1024 cap gives one chunk per node (never 7 rows and 1,
    which would run the second node's prompt twice)."""
    from coopflow.stages.update.policy_gradient import chunk_rows

    rows = [([n + 1] * 40, [7] * 128, 1.0, 0.1) for n in range(2) for _ in range(4)]
    shared = chunk_rows(rows, 1024, shared=True)
    assert [[r[0][0] for r in ch] for ch in shared] == [[1] * 4, [2] * 4]
    assert [len(ch) for ch in chunk_rows(rows, 1024)] == [4, 4]  # per row: 4 x 168 = 672, 8 x 168 = 1344
    big = [([3] * 40, [7] * 128, 1.0, 0.1)] * 12  # one prompt whose rows alone exceed the cap: cut by rows
    assert [len(ch) for ch in chunk_rows(big, 1024, shared=True)] == [7, 5]  # 40 + 7 x 128 = 936


def test_auto_loss_chunks_only_where_the_loss_runs_in_float32(tiny_model_dir):
    """trainer.loss_chunk_tokens: auto — 1024 tokens for a float32 loss; the whole minibatch at once under a bf16
    autocast or with bf16 weights; a number or null as given."""
    from transformers import AutoModelForCausalLM

    from coopflow.stages.agents.state import AgentState
    from coopflow.stages.update.policy_gradient import AUTO_LOSS_CHUNK_TOKENS, resolve_chunk_tokens

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    agent = AgentState(model=model, tokenizer=None, lr=1e-3)
    assert resolve_chunk_tokens("auto", agent) == AUTO_LOSS_CHUNK_TOKENS == 1024
    agent.compute_dtype = "bfloat16"
    assert resolve_chunk_tokens("auto", agent) is None
    agent.compute_dtype = None
    model.to(torch.bfloat16)
    assert resolve_chunk_tokens("auto", agent) is None
    assert resolve_chunk_tokens(512, agent) == 512 and resolve_chunk_tokens(None, agent) is None


def test_chunked_loss_passes_train_the_same_weights(tmp_path, pinned_threads):
    """trainer.loss_chunk_tokens: the minibatch's loss as several forward/backward passes whose gradients add up
    gives the one-pass weights (up to float summation order), under its own keys."""
    whole = run_inline(validate_config(small_config(tmp_path / "whole")))
    chunked = run_inline(validate_config(small_config(tmp_path / "chunked", trainer={
        **small_config(tmp_path)["trainer"], "loss_chunk_tokens": 24})))
    assert Path(chunked["checkpoint"]).name != Path(whole["checkpoint"]).name
    ww, wc = _weights(Path(whole["checkpoint"])), _weights(Path(chunked["checkpoint"]))
    assert all(torch.allclose(ww[k], wc[k], atol=1e-6) for k in ww)


# --- the loss passes' attention dtype (stages.agents.attention) ------------------------------------------------


class _AttentionDtypes(TorchDispatchMode):
    """Records the query dtype of every attention kernel that runs (forward and backward), as dispatched: below
    autocast, so a cast autocast makes is seen."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if "scaled_dot_product" in name:  # (a backward kernel's first argument is the output gradient, then q)
            backward = "backward" in name
            self.seen.setdefault("backward" if backward else "forward", set()).add(args[int(backward)].dtype)
        return func(*args, **(kwargs or {}))


def _loss_and_grads(model, tok):
    from coopflow.stages.agents.logprobs import sequence_logprobs

    model.zero_grad(set_to_none=True)
    prompt = tok("the moon is")["input_ids"]
    comps = [tok(c)["input_ids"] for c in (" a big red star .", " blue", " the sun and the moon")]
    loss = -sequence_logprobs(model, [prompt] * 3, comps, tok.pad_token_id).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fast", [False, True])
def test_bf16_loss_passes_attend_in_float32_where_bf16_attention_is_the_slower_kernel(tiny_model_dir, monkeypatch,
                                                                                       fast):
    """On a device without fast bf16 attention (a CPU without AMX) a bf16 agent's loss passes run SDPA on float32
    queries, keys and values, forward and backward; where bf16 attention is fast they stay bf16; back to plain SDPA
    when the compute dtype is the model's."""
    from coopflow.stages.agents import attention as AT
    from coopflow.stages.agents.models import load_agent_state
    from coopflow.stages.agents.state import set_compute_dtype

    monkeypatch.setattr(AT, "fast_bf16_attention", lambda device: fast)
    agent = load_agent_state(AgentSpec(str(tiny_model_dir), 1e-3))
    set_compute_dtype(agent, "bfloat16")
    assert agent.model.config._attn_implementation == ("sdpa" if fast else AT.WIDE_SDPA)
    agent.model.train()
    with _AttentionDtypes() as kernels, agent.autocast():
        loss, grads = _loss_and_grads(agent.model, agent.tokenizer)
    want = {torch.bfloat16 if fast else torch.float32}
    assert kernels.seen == {"forward": want, "backward": want}
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads.values())
    set_compute_dtype(agent, "model")
    assert agent.model.config._attn_implementation == "sdpa"


def test_the_float32_attention_is_plain_sdpa_without_autocast(tiny_model_dir, monkeypatch):
    """In float32 (the default, the reference's numerics) the wide attention changes nothing: the same loss and
    gradients bit for bit; a model on another attention implementation (eager) is never switched."""
    from coopflow.stages.agents import attention as AT
    from coopflow.stages.agents.models import load_agent

    monkeypatch.setattr(AT, "fast_bf16_attention", lambda device: False)
    model, tok = load_agent(tiny_model_dir)
    model.train()
    loss, grads = _loss_and_grads(model, tok)
    AT.use_wide_attention(model, "bfloat16")
    assert model.config._attn_implementation == AT.WIDE_SDPA
    loss_wide, grads_wide = _loss_and_grads(model, tok)
    assert torch.equal(loss, loss_wide) and grads.keys() == grads_wide.keys()
    assert all(torch.equal(grads[n], grads_wide[n]) for n in grads)
    eager, _ = load_agent(tiny_model_dir, attn_implementation="eager")
    AT.use_wide_attention(eager, "bfloat16")
    assert eager.config._attn_implementation == "eager"


def test_whether_bf16_attention_is_fast_enters_bf16_keys_only(tmp_path, monkeypatch):
    """The device's bf16 attention decides a bf16 run's numerics (the decode loop's KV cache, the loss passes'
    attention), so it is part of a bf16 run's keys; a float32 run's keys do not depend on it."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning import context as PC
    from coopflow.stages.tasks.taskset import build_taskset

    def start_key(fast: bool, agents: dict) -> str:
        monkeypatch.setattr(PC, "fast_bf16_attention", lambda device: fast)
        cfg = validate_config(small_config(tmp_path, agents=agents))
        store = ArtifactStore(tmp_path / "data")
        ctx = PC.make_context(cfg, store, build_taskset(cfg.taskset, store))
        ctx.session.close()
        return ctx.plan.start_key

    assert start_key(True, BF16) != start_key(False, BF16)
    plain = {"agent_model": "tiny", "num_agents": 2}
    assert start_key(True, plain) == start_key(False, plain)


def test_wide_attention_groups_query_heads_in_sdpa_instead_of_copying_keys(monkeypatch):
    """Masked grouped-query attention under a bf16 autocast on a CPU: `WIDE_SDPA` hands SDPA the 2 key/value heads
    with `enable_gqa` (transformers would copy them to the 4 query heads first) — the same outputs as transformers'
    float32 path, the same gradients up to summation order; a call without a mask keeps transformers' path."""
    import types

    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from coopflow.stages.agents import attention as AT

    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw.get("enable_gqa", False)) or sdpa(*a, **kw))
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=True)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, h, 6, 8, generator=gen, requires_grad=True) for h in (4, 2, 2))
    mask = torch.ones(3, 1, 6, 6, dtype=torch.bool).tril()
    mask[0, :, :, :2] = False  # a left-padded row
    mask[0, :, :2, 0] = mask[0, :, 1, 1] = True  # (a fully padded query row attends to something)
    g_out = torch.randn(3, 6, 4, 8, generator=gen)

    def run(fn, autocast: bool, m):
        for t in (q, k, v):
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out, _ = fn(module, q, k, v, m, dropout=0.0, scaling=0.3)
        out = out.to(torch.bfloat16).float()  # (so both backwards start from the same bf16-rounded gradient)
        out.backward(g_out)
        return out, [t.grad.clone() for t in (q, k, v)]

    out, grads = run(AT._sdpa_float32, True, mask)
    assert calls == [True]
    ref, ref_grads = run(sdpa_attention_forward, False, mask)
    assert calls[1:] == [False]  # transformers' path: the keys copied per query head
    assert torch.equal(out, ref)
    assert all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, ref_grads))
    calls.clear()
    run(AT._sdpa_float32, True, None)
    assert calls == [True]  # unmasked: transformers' own grouped call (is_causal), not ours
    assert not AT._grouped_on_cpu(module, q, None, {})
