"""Batched sequence log-probabilities: one padded, masked forward for many completions.

log π(a|h) of a completion is the **sum** of its token log-probs given the prompt (never
length-normalized, as in CoMLRL 1.4.3). Prompts are left-padded and completions right-padded into one
batch `[B, P + C]`; position ids skip the left pads; logits at positions P-1 .. P+C-2 predict
the completion tokens; tokens past each completion's length are masked out (so pads after EOS
never enter the loss).
"""

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


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materializing the full log-softmax: [B, T, V] -> [B, T]."""
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def sequence_logprobs(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                      return_tokens: bool = False):
    """Sum of completion-token log-probs per sequence: [B] (and [B, C] token values, masked to 0)."""
    device = next(model.parameters()).device
    ids, attn, cmask, P = pad_batch(prompts, completions, pad_id)
    ids, attn, cmask = ids.to(device), attn.to(device), cmask.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    C = cmask.shape[1]
    # Input drops the last token; its last C positions (P-1 .. P+C-2) predict the completion tokens,
    # so only those C positions go through the LM head (logits_to_keep).
    logits = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=pos[:, :-1],
                   use_cache=False, logits_to_keep=C).logits[:, -C:]
    tok = token_logprobs(logits, ids[:, P:P + C]) * cmask
    seq = tok.sum(-1)
    return (seq, tok) if return_tokens else seq
