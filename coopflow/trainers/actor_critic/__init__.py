"""The actor-critic family: IAC and MAAC."""

from coopflow.trainers.actor_critic.ac_base import ActorCriticTrainerBase, RolloutSample
from coopflow.trainers.actor_critic.iac import IACConfig, IACTrainer
from coopflow.trainers.actor_critic.maac import MAACConfig, MAACTrainer

__all__ = ["ActorCriticTrainerBase", "RolloutSample", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]
