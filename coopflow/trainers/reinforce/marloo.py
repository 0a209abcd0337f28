"""MARLOO: leave-one-out baseline (CoMLRL's `comlrl.trainers.reinforce.marloo`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MARLOOConfig

__all__ = ["MARLOOConfig", "MARLOOTrainer"]


class MARLOOTrainer(FacadeTrainer):
    """MARLOO with the reference's constructor (MAGRPO with another default advantage_mode)."""

    algorithm = "marloo"
    config_class = MARLOOConfig
