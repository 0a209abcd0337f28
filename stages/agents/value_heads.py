"""Value heads and critics for the actor-critic family.

A value head is Linear(hidden, d) → Tanh → Linear(d, 1) on the LM's last hidden state (d =
`value_head_hidden_dim`, default the hidden size), weights N(0, 0.02), biases zero. A critic is a
causal LM backbone plus a head. Readouts:

- V(h):   the value at the **last prompt token** (causal attention: it only sees the prompt);
- Q(h,a): the value at the **last response token** (prompt + completion).

Everything is batched: prompts are left-padded and completions right-padded into one `[B, P+C]`
batch (as in `logprobs.pad_batch`), one backbone forward gives every hidden state, and the LM head
runs only on the completion positions when log-probs are needed too (shared-head actors get their
log-probs and values from the same forward).
"""

from pathlib import Path

import torch
from torch import nn

from coopflow.stages.agents.logprobs import pad_batch, token_logprobs

HEAD_FILE = "value_head.pt"


class ValueHead(nn.Module):
    """Linear → Tanh → Linear(1) over hidden states: [..., H] -> [...]."""

    def __init__(self, hidden: int, dim: int | None = None, seed: int | None = None):
        super().__init__()
        d = dim or hidden
        self.net = nn.Sequential(nn.Linear(hidden, d), nn.Tanh(), nn.Linear(d, 1))
        gen = torch.Generator().manual_seed(seed) if seed is not None else None  # reproducible heads
        for m in self.net:
            if isinstance(m, nn.Linear):
                with torch.no_grad():
                    m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
                nn.init.zeros_(m.bias)
        self.hidden, self.dim = hidden, d

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h.to(self.net[0].weight.dtype)).squeeze(-1)


def hidden_size(model) -> int:
    """The LM's hidden size (config.hidden_size or n_embd)."""
    cfg = model.config
    h = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    if h is None:
        raise ValueError(f"cannot find the hidden size of {type(model).__name__} (no hidden_size/n_embd)")
    return int(h)


def new_head(model, dim: int | None = None, seed: int | None = None) -> ValueHead:
    """A freshly initialized head for `model`, on its device (seeded: the same head in every run)."""
    return ValueHead(hidden_size(model), dim, seed).to(next(model.parameters()).device)


def save_head(head: ValueHead, out_dir: Path) -> None:
    torch.save({"state_dict": head.state_dict(), "hidden": head.hidden, "dim": head.dim}, Path(out_dir) / HEAD_FILE)


def load_head(in_dir: Path, device) -> ValueHead | None:
    """The head saved in `in_dir`, or None when there is none."""
    f = Path(in_dir) / HEAD_FILE
    if not f.is_file():
        return None
    blob = torch.load(f, map_location="cpu", weights_only=True)
    head = ValueHead(blob["hidden"], blob["dim"])
    head.load_state_dict(blob["state_dict"])
    return head.to(device)


def forward_values(model, head: ValueHead, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                   critic_type: str, with_logprobs: bool = False):
    """Values [B] (V at the last prompt token, Q at the last response token) and, optionally, the
    summed completion log-probs [B] from the same forward."""
    if critic_type not in ("v", "q"):
        raise ValueError(f"critic_type must be 'v' or 'q', got {critic_type!r}")
    device = next(model.parameters()).device
    ids, attn, cmask, P = pad_batch(prompts, completions, pad_id)
    ids, attn, cmask = ids.to(device), attn.to(device), cmask.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    h = model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    if critic_type == "v":
        idx = torch.full((ids.shape[0],), P - 1, device=device)
    else:
        idx = P - 1 + cmask.sum(-1)  # last response token (last prompt token for an empty completion)
    values = head(h[torch.arange(ids.shape[0], device=device), idx])
    if not with_logprobs:
        return values
    C = cmask.shape[1]
    logits = model.get_output_embeddings()(h[:, P - 1:P - 1 + C])
    logp = (token_logprobs(logits, ids[:, P:P + C]) * cmask).sum(-1)
    return values, logp


def joint_critic_text(prompts: list[str], actions: list[str] | None = None) -> str:
    """MAAC's centralized critic input: '[Agent i] prompt_i' blocks, plus the joint action for Q."""
    text = "\n\n".join(f"[Agent {i}] {p}" for i, p in enumerate(prompts))
    if actions is not None:
        text += "\n\n[Joint Action]" + "".join(f"\n\n[Agent {i} action]\n{a}" for i, a in enumerate(actions))
    return text
