"""Model wrappers with the reference's names (`comlrl.models`)."""

from coopflow.models.actor_critic import ActorCriticOutput, CausalLMWithValueHead, ValueHead

__all__ = ["ActorCriticOutput", "CausalLMWithValueHead", "ValueHead"]
