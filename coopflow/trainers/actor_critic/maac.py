"""MAAC: one centralized critic (CoMLRL's `comlrl.trainers.actor_critic.maac`)."""

from coopflow.trainers.actor_critic.ac_base import ActorCriticTrainerBase
from coopflow.schemas.config import MAACConfig

__all__ = ["MAACConfig", "MAACTrainer"]


class MAACTrainer(ActorCriticTrainerBase):
    """Actors without heads and exactly one centralized critic (`critic_model`, or `critics` of length 1)."""

    algorithm = "maac"
    config_class = MAACConfig

    def _critic_count(self, n: int) -> int:
        return 1

    @property
    def critic_model(self):
        """The one centralized critic (`critics[0]`)."""
        return self.critics[0]

    @property
    def agent_model_name(self) -> str | None:
        """The agents' model name (as `model_name`: the source's name, e.g. a hub id or a directory's name)."""
        return self.model_name
