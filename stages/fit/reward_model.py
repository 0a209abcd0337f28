"""Stage: fit the joint reward model on preference pairs, and use it as a reward.

The reward model is a causal-LM backbone plus Linear(hidden, 1) on the hidden state of the **last
non-pad token** (right padding: index = sum(mask) − 1). It reads a joint answer as text:

    Joint multi-agent response

    Agent 1 prompt:
    <p_1>

    Agent 1 response:
    <c_1>
    ...

and is trained with the Bradley–Terry loss −log σ(s_w − s_l) on (winner, loser) joint answers,
`reward_num_train_epochs` seeded-shuffled passes in batches of `reward_train_batch_size` pairs
(optionally with the backbone frozen). Frozen afterwards, `RewardModelReward` scores joint actions
in batches for the online RL phase (evaluation always uses the task reward, never the RM).
"""

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coopflow.stages.agents.models import load_agent, resolve_device
from coopflow.stages.agents.state import adamw
from coopflow.stages.agents.value_heads import hidden_size

HEAD_FILE = "reward_head.pt"


def joint_text(prompts: list[str], completions: list[str]) -> str:
    """The reward model's input for one joint answer."""
    parts = ["Joint multi-agent response"]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        parts += [f"Agent {i + 1} prompt:\n{p}", f"Agent {i + 1} response:\n{c}"]
    return "\n\n".join(parts)


class JointRewardModel(nn.Module):
    """Backbone + linear head at the last non-pad token: [B, T] ids -> [B] scores."""

    def __init__(self, lm, tokenizer, freeze_backbone: bool = False, max_length: int | None = None, seed: int = 0):
        super().__init__()
        self.lm, self.tokenizer, self.max_length = lm, tokenizer, max_length
        p = next(lm.parameters())
        gen = torch.Generator().manual_seed(seed)
        self.head = nn.Linear(hidden_size(lm), 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=gen) * 0.02)
            self.head.bias.zero_()
        self.head.to(device=p.device, dtype=p.dtype)
        self.freeze_backbone = freeze_backbone
        lm.requires_grad_(not freeze_backbone)

    @property
    def device(self):
        return next(self.head.parameters()).device

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores from right-padded ids: the head on the last non-pad token's hidden state."""
        h = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        last = attention_mask.sum(-1) - 1
        return self.head(h[torch.arange(h.shape[0], device=h.device), last]).squeeze(-1)

    def score_texts(self, texts: list[str]) -> torch.Tensor:
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=self.max_length is not None,
                             max_length=self.max_length)
        return self.pooled(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device))

    def save(self, out: Path) -> None:
        self.lm.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        torch.save(self.head.state_dict(), Path(out) / HEAD_FILE)
        (Path(out) / "reward_model.json").write_text(json.dumps({"max_length": self.max_length,
                                                                 "freeze_backbone": self.freeze_backbone}))


def load_reward_model(source: str | Path, dtype: str = "float32", device: str = "cpu", freeze_backbone: bool = False,
                      max_length: int | None = None, seed: int = 0) -> JointRewardModel:
    """A reward model from a backbone source (fresh head) or a saved reward-model dir (its head)."""
    lm, tok = load_agent(source, dtype, None, device)
    tok.padding_side = "right"
    rm = JointRewardModel(lm, tok, freeze_backbone, max_length, seed)
    head = Path(str(source)) / HEAD_FILE
    if head.is_file():
        rm.head.load_state_dict(torch.load(head, map_location=resolve_device(device), weights_only=True))
    return rm


def bt_loss(s_w: torch.Tensor, s_l: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry: mean −log σ(s_w − s_l)."""
    return -F.logsigmoid(s_w - s_l).mean()


def pair_texts(pair_rows: list[dict]) -> dict[int, tuple[str, str]]:
    """{pair_id: (winner joint text, loser joint text)} from `pairs` rows (one per pair and agent)."""
    by: dict[int, list[dict]] = {}
    for r in pair_rows:
        by.setdefault(r["pair_id"], []).append(r)
    out = {}
    for pid, rows in by.items():
        rows.sort(key=lambda r: r["agent"])
        prompts = [r["prompt"] for r in rows]
        out[pid] = (joint_text(prompts, [r["chosen"] for r in rows]), joint_text(prompts, [r["rejected"] for r in rows]))
    return out


def fit_reward_model(rm: JointRewardModel, texts: dict[int, tuple[str, str]], lr: float, epochs: int,
                     batch_size: int, seed: int) -> list[dict[str, float]]:
    """Bradley–Terry training; one metrics dict per step (loss, accuracy, margin)."""
    params = [p for p in rm.parameters() if p.requires_grad]
    opt = adamw(params, lr)
    rng = random.Random(seed)
    ids = sorted(texts)
    out = []
    rm.train()
    for _ in range(epochs):
        rng.shuffle(ids)
        for b in range(0, len(ids), batch_size):
            chunk = ids[b:b + batch_size]
            s = rm.score_texts([texts[i][0] for i in chunk] + [texts[i][1] for i in chunk])
            s_w, s_l = s[:len(chunk)], s[len(chunk):]
            loss = bt_loss(s_w, s_l)
            if not torch.isfinite(loss):
                raise FloatingPointError("non-finite reward-model loss; lower reward_learning_rate")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            out.append({"loss": loss.item(), "accuracy": (s_w > s_l).float().mean().item(),
                        "margin": (s_w - s_l).mean().item()})
    rm.eval()
    return out


@torch.no_grad()
def rank_metrics(rm: JointRewardModel, texts: dict[int, tuple[str, str]], batch_size: int = 16) -> dict[str, float]:
    """Accuracy (s_w > s_l) and mean margin of the reward model on pairs."""
    rm.eval()
    ids = sorted(texts)
    acc = marg = 0.0
    for b in range(0, len(ids), batch_size):
        chunk = ids[b:b + batch_size]
        s = rm.score_texts([texts[i][0] for i in chunk] + [texts[i][1] for i in chunk])
        d = s[:len(chunk)] - s[len(chunk):]
        acc += (d > 0).float().sum().item()
        marg += d.sum().item()
    return {"reward_model/accuracy": acc / max(1, len(ids)), "reward_model/margin": marg / max(1, len(ids))}


class RewardModelReward:
    """A frozen reward model as the shared reward: fn(*per_agent_completions, batch_items=[item]) -> scores.

    The agents' prompts come from their formatters applied to the item, as the reference's MARLHF."""

    def __init__(self, rm: JointRewardModel, formatters: list):
        self.rm, self.formatters = rm, formatters
        self.__name__ = "reward_model"

    @torch.no_grad()
    def __call__(self, *completions, batch_items=None):
        item = (batch_items or [{}])[0]
        prompts = [f(item) for f in self.formatters]
        texts = [joint_text(prompts, [c[j] for c in completions]) for j in range(len(completions[0]))]
        self.rm.eval()
        return self.rm.score_texts(texts).float().tolist()
