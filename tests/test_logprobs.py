"""Batched sequence log-probs against the generation's own raw logits, on the tiny model."""

import functools

import pytest
import torch

from coopflow.stages.rollout.generate import SamplingConfig, generate_for_agent, trim_completion
from coopflow.stages.agents.logprobs import pad_batch, sequence_logprobs, token_logprobs
from coopflow.stages.agents.models import build_tiny_model, load_agent

PROMPTS = ["once upon a time there was a little fox", "the moon", "write a story about the ocean city"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tok = load_agent(build_tiny_model(tmp_path_factory.mktemp("tiny")))
    return model, tok


# --- pad_batch / token_logprobs (no model) ---------------------------------------------------------


def test_pad_batch_hand_example():
    ids, attn, cmask, P = pad_batch([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    assert P == 3
    assert ids.tolist() == [[5, 6, 7, 1, 2, 0],
                            [0, 0, 8, 3, 4, 9]]
    assert attn.tolist() == [[1, 1, 1, 1, 1, 0],
                             [0, 0, 1, 1, 1, 1]]
    assert cmask.tolist() == [[True, True, False],
                              [True, True, True]]
    assert ids.dtype == torch.long and attn.dtype == torch.long and cmask.dtype == torch.bool


def test_pad_batch_empty_completion_and_pad_id():
    ids, attn, cmask, P = pad_batch([[4, 4], [7]], [[], []], pad_id=99)
    assert P == 2
    assert ids.tolist() == [[4, 4, 99], [99, 7, 99]]
    assert attn.tolist() == [[1, 1, 0], [0, 1, 0]]
    assert cmask.tolist() == [[False], [False]]


def test_token_logprobs_equals_log_softmax_gather():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    targets = torch.tensor([[0, 5, 10], [3, 3, 7]])
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, targets), expected, atol=1e-6, rtol=0)


# --- against the generation's logits ---------------------------------------------------------------


def _sample(model, tok, eos_id, seed=1234, max_new_tokens=8):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
                             eos_token_id=eos_id)
    return enc, out


def test_sequence_logprobs_match_generation_logits(tiny):
    model, tok = tiny
    P = tok(PROMPTS, return_tensors="pt", padding=True)["input_ids"].shape[1]
    # First pass: pick as "EOS" a token that row 0 samples at step 2 (and not before), so that the second
    # pass (same seed, same RNG draws) ends row 0 at step 2 and generate pads it afterwards.
    # Rows 1 and 2 must not hit it in their first 4 tokens, so generation runs past row 0's end.
    for seed in range(1234, 1334):
        _, first = _sample(model, tok, eos_id=tok.eos_token_id, seed=seed)
        rows = first.sequences[:, P:].tolist()
        eos = rows[0][2]
        if (eos not in rows[0][:2] and eos not in (tok.pad_token_id, tok.eos_token_id)
                and eos not in rows[1][:4] and eos not in rows[2][:4] and tok.eos_token_id not in sum(rows, [])):
            break
    else:
        pytest.fail("no usable seed")
    enc, out = _sample(model, tok, eos_id=eos, seed=seed)
    gen = out.sequences[:, P:]
    logits = torch.stack(out.logits, dim=1).float()  # [B, steps, V], raw (before sampling processors)
    assert gen.shape[1] == logits.shape[1] >= 4
    assert gen[0, 2] == eos and (gen[0, 3:] == tok.pad_token_id).all()  # padding after the first EOS

    prompts = [[t for t, m in zip(enc["input_ids"][b].tolist(), enc["attention_mask"][b].tolist()) if m]
               for b in range(len(PROMPTS))]
    assert len({len(p) for p in prompts}) == 3  # different prompt lengths -> real left padding
    comps = [trim_completion(gen[b].tolist(), eos)[0] for b in range(len(PROMPTS))]
    assert len(comps[0]) == 3  # EOS kept as the last action token

    seq, tokv = sequence_logprobs(model, prompts, comps, tok.pad_token_id, return_tokens=True)
    C = max(len(c) for c in comps)
    assert seq.shape == (3,) and tokv.shape == (3, C)
    ref = torch.log_softmax(logits, dim=-1)
    for b, c in enumerate(comps):
        L = len(c)
        expected = ref[b, torch.arange(L), torch.tensor(c)]
        torch.testing.assert_close(tokv[b, :L].detach(), expected, atol=1e-4, rtol=0)
        assert (tokv[b, L:] == 0).all()  # past the completion (EOS) nothing counts
        torch.testing.assert_close(seq[b].detach(), expected.sum(), atol=1e-4, rtol=0)

    # masking: a completion cut after 2 tokens has exactly the first 2 token log-probs of the full one
    cut = [comps[1][:2], comps[1]]
    seq2, tok2 = sequence_logprobs(model, [prompts[1], prompts[1]], cut, tok.pad_token_id, return_tokens=True)
    assert (tok2[0, 2:] == 0).all()
    torch.testing.assert_close(tok2[0, :2], tok2[1, :2], atol=1e-5, rtol=0)
    torch.testing.assert_close(seq2[0], tok2[1, :2].sum(), atol=1e-5, rtol=0)


def test_sequence_logprobs_batch_invariant_and_differentiable(tiny):
    model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    comps = [[5, 6, 7, 8], [9], [10, 11]]
    together = sequence_logprobs(model, prompts, comps, tok.pad_token_id)
    alone = torch.cat([sequence_logprobs(model, [p], [c], tok.pad_token_id) for p, c in zip(prompts, comps)])
    torch.testing.assert_close(together.detach(), alone.detach(), atol=1e-4, rtol=0)
    assert (together < 0).all()
    together.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.zero_grad(set_to_none=True)


# --- generate_for_agent ----------------------------------------------------------------------------


def test_generate_for_agent_rows(tiny):
    model, tok = tiny
    sampling = SamplingConfig(num_generations=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None)
    rows = generate_for_agent(model, tok, PROMPTS, 2, sampling, seed=7)
    assert len(rows) == len(PROMPTS) * 2
    for j, prompt in enumerate(PROMPTS):
        for s in range(2):
            p_ids, c_ids, text, finished, kl = rows[j * 2 + s]
            assert kl == 0.0
            assert p_ids == tok(prompt)["input_ids"]  # left pads removed
            assert 1 <= len(c_ids) <= 6
            assert finished == (c_ids[-1] == tok.eos_token_id)
            assert tok.eos_token_id not in c_ids[:-1]
            assert text == tok.decode(c_ids[:-1] if finished else c_ids, skip_special_tokens=True)
    assert generate_for_agent(model, tok, PROMPTS, 2, sampling, seed=7) == rows  # seeded: reproducible
    assert not model.training
    seq = sequence_logprobs(model, [r[0] for r in rows], [r[1] for r in rows], tok.pad_token_id)
    assert seq.shape == (6,) and torch.isfinite(seq).all() and (seq < 0).all()


def test_trim_completion():
    assert trim_completion([4, 5, 1, 0, 0], 1) == ([4, 5, 1], True)
    assert trim_completion([4, 1, 1, 0], 1) == ([4, 1], True)
    assert trim_completion([4, 5, 6], 1) == ([4, 5, 6], False)
    assert trim_completion([4, 5], None) == ([4, 5], False)


def _reference_node_loss(model, node, pad):
    """CoMLRL 1.4.3's per-completion loss, written out literally: rows padded to the node's
    longest, one forward per row on prompt ‖ row[:-1], logits[P-1:-1], mean of -logp·A over scored rows."""
    longest = max(len(c["completion_ids"]) for c in node)
    total, n = torch.tensor(0.0), 0
    for c in node:
        row = torch.tensor(c["completion_ids"] + [pad] * (longest - len(c["completion_ids"])))
        prompt = torch.tensor(c["prompt_ids"])
        inp = torch.cat([prompt, row[:-1]])
        logits = model(input_ids=inp[None], attention_mask=torch.ones(1, len(inp)), use_cache=False).logits
        logits = logits[0, len(prompt) - 1:-1]
        lps = [torch.log_softmax(logits[i], -1)[t] for i, t in enumerate(row) if i < logits.shape[0]]
        if lps:
            total = total - torch.stack(lps).sum() * c["advantage"]
            n += 1
    return total / max(n, 1)


def test_loss_on_padding_quirk_equals_the_reference_loss_and_gradient(tiny):
    """pad_tail: pads to the node's longest enter the loss, the last token of each padded row does not."""
    from coopflow.stages.update.policy_gradient import policy_loss

    model, tok = tiny[0], tiny[1]
    pad = tok.pad_token_id
    nodes = [[{"prompt_ids": [5, 6, 7], "completion_ids": [8, 9, 10, 11], "advantage": 1.0},
              {"prompt_ids": [5, 6, 7], "completion_ids": [12, 13], "advantage": -1.0}],
             [{"prompt_ids": [20, 21], "completion_ids": [30, 31, 32], "advantage": 0.5},
              {"prompt_ids": [20, 21], "completion_ids": [33], "advantage": -0.5}]]
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(loss):
        g = torch.autograd.grad(loss, params, allow_unused=True)
        return [torch.zeros_like(p) if x is None else x for x, p in zip(g, params)]

    quirk, ntok = policy_loss(model, nodes, pad, pad_tail=True)
    ref = sum(_reference_node_loss(model, node, pad) for node in nodes) / len(nodes)
    assert quirk.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)
    assert ntok == 2 * 3 + 2 * 2  # rows of 4 and 3 tokens, each without its last
    for a, b in zip(grads(quirk), grads(ref)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    plain, ntok_plain = policy_loss(model, nodes, pad)
    assert ntok_plain == 10 and quirk.item() != pytest.approx(plain.item(), abs=1e-6)


@pytest.mark.parametrize("lengths", [[5, 1, 9, 3, 7, 2, 6], [1, 1, 1, 1, 1, 1, 1], [4, 0, 2, 4, 3, 1, 2]])
def test_rows_sharing_a_prompt_run_it_once_with_the_same_values_and_gradients(tiny, monkeypatch, lengths):
    """A node's K completions share one forward over their prompt (its KV cache copied to the K rows): the
    log-probs and every parameter's gradient equal one forward per row; the prompt pass sees the distinct prompts
    only; rows in any order, prompts of different lengths (left pads), empty and one-token completions."""
    model, tok = tiny
    P = [tok(p).input_ids for p in PROMPTS]
    order = [2, 0, 1, 2, 0, 2, 1]
    prompts = [P[i] for i in order]
    g = torch.Generator().manual_seed(len(lengths) + sum(lengths))
    comps = [torch.randint(3, len(tok) - 1, (n,), generator=g).tolist() for n in lengths]
    weights = torch.arange(1.0, 8.0)
    model.train()
    out = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        seen = []
        real = type(model).forward

        @functools.wraps(real)
        def counted(self, *a, **k):
            seen.append(k["input_ids"].shape)
            return real(self, *a, **k)

        monkeypatch.setattr(type(model), "forward", counted)
        seq = sequence_logprobs(model, prompts, comps, tok.pad_token_id, share_prompts=share)
        monkeypatch.undo()
        (seq * weights).sum().backward()
        out[share] = seq.detach(), [p.grad.clone() for p in model.parameters()], seen
    model.eval()
    (s0, g0, seen0), (s1, g1, seen1) = out[False], out[True]
    assert len(seen0) == 1 and seen1[0][0] == 3  # 3 distinct prompts in the shared prompt pass
    assert len(seen1) == (2 if max(lengths) > 1 else 1)
    torch.testing.assert_close(s1, s0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()) + 1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_token_logprobs_equal_the_plain_form_values_and_gradients(dtype):
    """token_logprobs block by block (the default) gives exactly the plain form's numbers and gradients — float32
    logits, and bf16 logits as under autocast (whose gradient is rounded to bf16 the same way) — with blocks that
    do not divide the positions; values against a hand computation on one position."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 37, 101, generator=g) * 3).to(dtype).requires_grad_()
    t = torch.randint(0, 101, (3, 37), generator=g)
    w = torch.randn(3, 37, generator=g)
    plain = token_logprobs(x, t, chunk=None)
    (plain * w).sum().backward()
    g_plain, x.grad = x.grad.clone(), None
    chunked = token_logprobs(x, t, chunk=16)
    (chunked * w).sum().backward()
    assert chunked.dtype == torch.float32 and torch.equal(chunked, plain) and torch.equal(x.grad, g_plain)
    row = x[1, 5].detach().double()
    assert abs(chunked[1, 5].item() - (row[t[1, 5]] - row.exp().sum().log()).item()) < 1e-5
    soft = row.softmax(-1)
    hand = -w[1, 5].double() * soft
    hand[t[1, 5]] += w[1, 5]
    assert torch.allclose(x.grad[1, 5].double(), hand, atol=1e-6 if dtype == torch.float32 else 1e-2)
