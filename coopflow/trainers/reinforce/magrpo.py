"""MAGRPO: group-mean baseline (CoMLRL's `comlrl.trainers.reinforce.magrpo`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MAGRPOConfig

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]


class MAGRPOTrainer(FacadeTrainer):
    """Multi-agent GRPO with the reference's constructor; trains through coopflow's stages."""

    algorithm = "magrpo"
    config_class = MAGRPOConfig
