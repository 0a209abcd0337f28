"""The actor-critic family: IAC and MAAC."""

from coopflow.trainers.actor_critic.iac import IACConfig, IACTrainer
from coopflow.trainers.actor_critic.maac import MAACConfig, MAACTrainer

__all__ = ["IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]
