"""MAREINFORCE: no baseline (advantage = return) (CoMLRL's `comlrl.trainers.reinforce.mareinforce`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MAREINFORCEConfig

__all__ = ["MAREINFORCEConfig", "MAREINFORCETrainer"]


class MAREINFORCETrainer(FacadeTrainer):
    """MAREINFORCE with the reference's constructor (MAGRPO with another default advantage_mode)."""

    algorithm = "mareinforce"
    config_class = MAREINFORCEConfig
