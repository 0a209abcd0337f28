"""Stage: fit / update critic — value predictions and value-loss steps.

A critic (or an actor's own value head) predicts V(h) or Q(h,a) for a batch of samples in one
padded forward (`value_model.forward_values`). The value loss of a minibatch is

    mean_b (y_b − V_b)²                                   (separate critics, MAAC)
    mean_b max((y_b − V_b)², (y_b − V_clip,b)²),  V_clip = V_old + clip(V − V_old, ±ε)   (IAC shared head)

scaled by `value_loss_coef`. `fit_critic` re-fits a critic from stored samples (the `ac_samples`
artifact: prompts, completions and value targets), so a critic can be refit without generating.
"""

import random

import torch

from coopflow.stages.agents.state import CriticState
from coopflow.stages.agents.value_heads import forward_values


def critic_token_ids(crit: CriticState, samples: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids) in the critic's vocabulary: the actor's ids when the vocabularies
    match, else the texts re-tokenized with the critic's tokenizer; MAAC samples carry a joint text."""
    if samples and "critic_text" in samples[0]:
        tok = crit.tokenizer
        return [tok(s["critic_text"], add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
                for s in samples], [[] for _ in samples]
    if crit.same_vocab:
        return [s["prompt_ids"] for s in samples], [s["completion_ids"] for s in samples]
    tok = crit.tokenizer
    return ([tok(s["prompt"], add_special_tokens=False)["input_ids"] or [tok.eos_token_id] for s in samples],
            [tok(s["completion_text"], add_special_tokens=False)["input_ids"] for s in samples])


@torch.no_grad()
def predict_values(crit: CriticState, samples: list[dict], critic_type: str) -> list[float]:
    """V_old / Q_old of every sample (no gradient)."""
    if not samples:
        return []
    p, c = critic_token_ids(crit, samples)
    crit.model.eval()
    kind = "v" if "critic_text" in samples[0] else critic_type  # joint texts hold the action already (Q)
    return forward_values(crit.model, crit.head, p, c, crit.tokenizer.pad_token_id, kind).float().tolist()


def value_error(values: torch.Tensor, targets: torch.Tensor, old: torch.Tensor | None = None,
                clip: float | None = None) -> torch.Tensor:
    """Per-sample squared error; PPO-style clipped when `clip` is given."""
    err = (targets - values) ** 2
    if clip is None or old is None:
        return err
    clipped = old + torch.clamp(values - old, -clip, clip)
    return torch.max(err, (targets - clipped) ** 2)


def critic_step(crit: CriticState, samples: list[dict], critic_type: str, coef: float) -> dict[str, float]:
    """One AdamW step of the critic on `coef × mean (y − V)²` over a minibatch of samples."""
    p, c = critic_token_ids(crit, samples)
    kind = "v" if "critic_text" in samples[0] else critic_type
    crit.model.train()
    opt = crit.ensure_optimizer()
    opt.zero_grad(set_to_none=True)
    values = forward_values(crit.model, crit.head, p, c, crit.tokenizer.pad_token_id, kind)
    y = torch.tensor([s["value_target"] for s in samples], dtype=values.dtype, device=values.device)
    loss = value_error(values, y).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite value loss ({loss.item()}); lower critic_learning_rate")
    (coef * loss).backward()
    opt.step()
    crit.model.eval()
    return {"value_loss": loss.item(), "value_pred_mean": values.mean().item()}


def fit_critic(crit: CriticState, samples: list[dict], critic_type: str, batch_size: int, epochs: int = 1,
               coef: float = 1.0, seed: int = 0) -> list[dict[str, float]]:
    """Re-fit a critic on stored samples: `epochs` shuffled passes of minibatch value-loss steps."""
    rng = random.Random(seed)
    out = []
    for _ in range(epochs):
        order = list(samples)
        rng.shuffle(order)
        for b in range(0, len(order), batch_size):
            out.append(critic_step(crit, order[b:b + batch_size], critic_type, coef))
    return out
