"""Batched sequence log-probabilities: one padded, masked forward for many completions.

log π(a|h) of a completion is the **sum** of its token log-probs given the prompt (never
length-normalized, as in CoMLRL 1.4.3). Prompts are left-padded and completions right-padded into one
batch `[B, P + C]`; position ids skip the left pads; logits at positions P-1 .. P+C-2 predict
the completion tokens; tokens past each completion's length are masked out (so pads after EOS
never enter the loss). Rows that repeat a prompt (a node's K samples) share one forward over it.
"""

import inspect

import torch


def pad_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int):
    """Left-pad prompts, right-pad completions.

    Returns input_ids [B, P+C], attention_mask [B, P+C], completion_mask [B, C], P.
    """
    B = len(prompts)
    P = max(len(p) for p in prompts)
    C = max(1, max(len(c) for c in completions))
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    cmask = torch.zeros((B, C), dtype=torch.bool)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        ids[b, P - len(p):P] = torch.as_tensor(p, dtype=torch.long)
        attn[b, P - len(p):P] = 1
        if c:
            ids[b, P:P + len(c)] = torch.as_tensor(c, dtype=torch.long)
            attn[b, P:P + len(c)] = 1
            cmask[b, :len(c)] = True
    return ids, attn, cmask, P


def completion_mask(completions: list[list[int]], like: torch.Tensor) -> torch.Tensor:
    """[B, C] bool mask of each completion's tokens, in the shape and on the device of `like` (the token log-probs
    `sequence_logprobs(..., return_tokens=True)` returns)."""
    lengths = torch.tensor([len(c) for c in completions], device=like.device)
    return torch.arange(like.shape[-1], device=like.device)[None, :] < lengths[:, None]


BLOCK_FLOATS = 2**19
"""Float32 values per block of `token_logprobs` (2 MB: a block stays in a core's cache; 10 positions of a 49k
vocabulary, 1365 of a 384-token one)."""


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk: int | str | None = "auto") -> torch.Tensor:
    """log softmax(logits)[target] in float32 without materializing the log-softmax: [B, T, V] -> [B, T].

    `chunk`: positions per float32 block (`_PickedLogprob`): the float32 logits, their exponentials and the
    backward's softmax exist for `chunk` positions at a time, never for all B·T (bf16 logits under autocast are
    never copied to float32 whole); the same numbers and gradients as the plain form. 'auto': as many positions as
    fit in `BLOCK_FLOATS` (a few for a real vocabulary: the block stays in the core's cache; many for a small one:
    few Python steps). None: the plain autograd form (kept to measure this lever)."""
    if chunk == "auto":
        chunk = max(1, BLOCK_FLOATS // logits.shape[-1])
    if chunk is None:
        logits = logits.float()
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    return _PickedLogprob.apply(logits, targets, chunk)


class _PickedLogprob(torch.autograd.Function):
    """y = x[target] - logsumexp(x) per position, x in float32, block by block of `chunk` positions.

    Backward: dy/dx = onehot(target) - softmax(x), so grad_x = g·onehot - g·exp(x - lse) (lse saved from the
    forward): the two terms autograd adds for the gather and the logsumexp of the plain form, in the same float
    operations (exp(x - lse)·(-g) is -(g·exp(x - lse)) exactly), in place on each block's float32 copy, written
    block by block into a gradient of the logits' own dtype."""

    @staticmethod
    def forward(ctx, logits, targets, chunk):
        V = logits.shape[-1]
        flat, tflat = logits.reshape(-1, V), targets.reshape(-1, 1)
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(lse)
        for i in range(0, flat.shape[0], chunk):
            x = flat[i:i + chunk].float()
            lse[i:i + chunk] = torch.logsumexp(x, dim=-1)
            picked[i:i + chunk] = x.gather(-1, tflat[i:i + chunk]).squeeze(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk = chunk
        return (picked - lse).view(targets.shape)

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        V = logits.shape[-1]
        flat, tflat, g = logits.reshape(-1, V), targets.reshape(-1, 1), grad.reshape(-1, 1).float()
        out = torch.empty_like(flat)
        for i in range(0, flat.shape[0], ctx.chunk):
            j = slice(i, i + ctx.chunk)
            d = flat[j].to(torch.float32, copy=True).sub_(lse[j, None]).exp_().mul_(-g[j])  # (a copy: in place)
            out[j] = d.scatter_add_(-1, tflat[j], g[j])
        return out.view(logits.shape), None, None


def sequence_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                      return_tokens: bool = False, share_prompts: bool = True):
    """Sum of completion-token log-probs per sequence: [B] (and [B, C] token values, masked to 0).

    `share_prompts`: when rows repeat a prompt (a node's K completions), run each distinct prompt through the model
    once and its K completions on top of its cache (`_shared_prompt_logits`); the same values and gradients as
    one forward per row, with the prompt's compute and activations paid once instead of K times.
    """
    device = next(model.parameters()).device
    groups = _prompt_groups(prompts) if share_prompts and shares_prompts(model) else None
    if groups is not None:
        blocks, targets, cmask = _shared_prompt_logits(model, prompts, completions, pad_id, groups, device)
    else:
        ids, attn, cmask, P = pad_batch(prompts, completions, pad_id)
        ids, attn, cmask = ids.to(device), attn.to(device), cmask.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        C = cmask.shape[1]
        # Input drops the last token; its last C positions (P-1 .. P+C-2) predict the completion tokens,
        # so only those C positions go through the LM head (logits_to_keep).
        blocks = [model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                        use_cache=False, logits_to_keep=C).logits[:, -C:]]
        targets = ids[:, P:P + C]
    # each block of logits [B, c, V] predicts the next c target columns: their log-probs are taken block by block,
    # so the logits are never concatenated into one [B, C, V] copy
    parts = targets.split([b.shape[1] for b in blocks], 1)
    tok = torch.cat([token_logprobs(b, t) for b, t in zip(blocks, parts)], 1) * cmask
    seq = tok.sum(-1)
    return (seq, tok) if return_tokens else seq


_SHARING_FAMILIES = {"qwen2", "llama", "mistral"}  # causal LMs whose cache + mask path is tested equal (tests)


def shares_prompts(model) -> bool:
    """Whether `sequence_logprobs` runs each distinct prompt of a batch once for this model (its family's cache and
    mask path is tested equal to one forward per row)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in _SHARING_FAMILIES


def _cache_kwarg(model) -> str:
    """The forward's name for a KV cache: 'cache' in newer transformers 5 releases, 'past_key_values' before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # (PEFT wraps the model)
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _prompt_groups(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]] | None:
    """(distinct prompts, each row's index into them), or None when no prompt repeats."""
    index: dict[tuple, int] = {}
    inverse = [index.setdefault(tuple(p), len(index)) for p in prompts]
    if len(index) == len(prompts):
        return None
    return [list(p) for p in index], inverse


def _shared_prompt_logits(model, prompts, completions, pad_id: int, groups, device):
    """Logits predicting each completion token, as blocks along the completion ([B, 1, V] for the first token, then
    [B, C - 1, V] for the rest when C > 1), the tokens [B, C] and their mask, with every distinct prompt run once:
    pass 1 over the U left-padded prompts keeps their KV cache and the last position's logits (they predict
    each completion's first token); the cache is then copied to the B rows (autograd sums the K rows' gradients
    back into their prompt) and pass 2 runs the right-padded completions (minus their last token) on top of it."""
    uniq, inverse = groups
    ids_p, attn_p, _, P = pad_batch(uniq, [[]] * len(uniq), pad_id)
    ids_p, attn_p = ids_p[:, :P].to(device), attn_p[:, :P].to(device)
    pos_p = (attn_p.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids_p, attention_mask=attn_p, position_ids=pos_p, use_cache=True, logits_to_keep=1)
    inv = torch.tensor(inverse, dtype=torch.long, device=device)
    targets, _, cmask, _ = pad_batch([[]] * len(completions), completions, pad_id)  # right-padded completions only
    targets, cmask = targets.to(device), cmask.to(device)
    C = cmask.shape[1]
    blocks = [out.logits[:, -1:][inv]]  # [B, 1, V]
    if C > 1:
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_select_indices(inv)
        attn = torch.cat([attn_p[inv], cmask[:, :-1].long()], 1)  # [B, P + C - 1]
        pos = pos_p[inv][:, -1:] + torch.arange(1, C, device=device)  # completion positions follow the prompt's
        blocks.append(model(input_ids=targets[:, :-1], attention_mask=attn, position_ids=pos, use_cache=True,
                            **{_cache_kwarg(model): cache}).logits)  # [B, C - 1, V]
    return blocks, targets, cmask
