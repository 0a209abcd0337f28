"""MADPO: offline multi-agent DPO (CoMLRL's `comlrl.trainers.preference.madpo`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MADPOConfig

__all__ = ["MADPOConfig", "MADPOTrainer"]


class MADPOTrainer(FacadeTrainer):
    """Candidates → task-reward pairs → joint-factorized DPO, with the reference's constructor."""

    algorithm = "madpo"
    config_class = MADPOConfig
