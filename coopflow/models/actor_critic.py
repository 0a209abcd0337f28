"""`CausalLMWithValueHead`: a causal LM plus a scalar value head (`comlrl.models.actor_critic`).

The head is coopflow's (`stages.agents.value_heads.ValueHead`: Linear → Tanh → Linear(1) over the LM's last
hidden states), the one IAC's shared-head mode trains; `forward` returns the LM's logits and one value per
position.
"""

from dataclasses import dataclass

import torch
from torch import nn

from coopflow.stages.agents.value_heads import ValueHead as _Head
from coopflow.stages.agents.value_heads import hidden_size

__all__ = ["ActorCriticOutput", "ValueHead", "CausalLMWithValueHead"]


@dataclass
class ActorCriticOutput:
    """logits [B, T, V], values [B, T] (None without a head), and the LM's hidden states / cache if asked."""

    logits: torch.Tensor
    values: torch.Tensor | None
    hidden_states: tuple | None = None
    past_key_values: tuple | None = None


class ValueHead(_Head):
    """Linear(input_dim, hidden_dim) → Tanh → Linear(1): [..., input_dim] -> [...]."""

    def __init__(self, input_dim: int, hidden_dim: int | None = None):
        super().__init__(input_dim, hidden_dim)


class CausalLMWithValueHead(nn.Module):
    """`base_model` (any HF causal LM) with a value head on its last hidden states (unless attach_value_head is
    False); `generate` is the base model's."""

    def __init__(self, base_model, value_head_hidden_dim: int | None = None, attach_value_head: bool = True):
        super().__init__()
        self.model = base_model
        self.config = base_model.config
        self.value_head = ValueHead(hidden_size(base_model), value_head_hidden_dim) if attach_value_head else None
        if self.value_head is not None:
            self.value_head.to(next(base_model.parameters()).device)

    def forward(self, input_ids=None, attention_mask=None, output_hidden_states: bool = False, use_cache=None,
                **kwargs) -> ActorCriticOutput:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                         use_cache=use_cache, **kwargs)
        values = self.value_head(out.hidden_states[-1]) if self.value_head is not None else None
        return ActorCriticOutput(out.logits, values, out.hidden_states if output_hidden_states else None,
                                 getattr(out, "past_key_values", None))

    def generate(self, *args, **kwargs):
        return self.model.generate(*args, **kwargs)
