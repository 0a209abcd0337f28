"""`ActorCriticTrainerBase` and `RolloutSample` (CoMLRL's `comlrl.trainers.actor_critic.ac_base` / `.iac`).

IAC and MAAC share this base here as in the reference: the constructor, critic handling, train, evaluate and
save of `coopflow._facade` plus the critic rules of `_critics`. `RolloutSample` is the record a
`metrics_callback` of the reference's actor-critic trainers receives; coopflow's own callbacks get dicts
(item_id, turn, agent, sample, prompt, completion_text, reward), and `RolloutSample.from_row` converts one.
"""

from dataclasses import dataclass, field
from typing import Any

import torch

from coopflow.trainers.actor_critic._critics import CriticTrainer

__all__ = ["ActorCriticTrainerBase", "RolloutSample"]


class ActorCriticTrainerBase(CriticTrainer):
    """The shared actor-critic trainer (IACTrainer and MAACTrainer derive from it)."""

    algorithm_name = "AC"


@dataclass
class RolloutSample:
    """One agent's completion at one node of an actor-critic rollout (tensors of shape [T] or scalars)."""

    agent_idx: int
    prompt: str
    completion: str
    full_input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    response_len: int
    old_logprob: torch.Tensor
    old_value: torch.Tensor
    reward: torch.Tensor
    returns: torch.Tensor
    advantage: torch.Tensor
    normalized_advantage: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict) -> "RolloutSample":
        """A sample from one of coopflow's rollout/ac_samples rows (missing numbers become 0)."""
        p, c = list(row.get("prompt_ids") or []), list(row.get("completion_ids") or [])
        ids = torch.tensor(p + c, dtype=torch.long)

        def num(k):
            return torch.tensor(float(row.get(k) or 0.0))

        return cls(agent_idx=int(row.get("agent", 0)), prompt=row.get("prompt", ""),
                   completion=row.get("completion_text", ""), full_input_ids=ids,
                   attention_mask=torch.ones_like(ids), prompt_len=len(p), response_len=len(c),
                   old_logprob=num("old_logprob"), old_value=num("old_value"), reward=num("reward"),
                   returns=num("value_target"), advantage=num("advantage"),
                   metadata={k: row[k] for k in ("item_id", "turn", "sample") if k in row})
