"""IAC: independent actor-critic (CoMLRL's `comlrl.trainers.actor_critic.iac`)."""

from coopflow.trainers.actor_critic.ac_base import ActorCriticTrainerBase, RolloutSample
from coopflow.schemas.config import IACConfig

__all__ = ["IACConfig", "IACTrainer", "RolloutSample"]


class IACTrainer(ActorCriticTrainerBase):
    """One critic per agent: separate critic LMs + heads (`critic_model` / `critics`), or a value head on
    each actor (`use_separate_critic=False`, no critic sources allowed)."""

    algorithm = "iac"
    config_class = IACConfig

    def _wants_critics(self) -> bool:
        return self.args.use_separate_critic

    def _critic_count(self, n: int) -> int:
        return n

    @property
    def critic_models(self) -> list:
        """The agents' separate critics (the same objects as `critics`; empty with a value head on each actor)."""
        return self.critics
