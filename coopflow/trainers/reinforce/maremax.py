"""MAReMax: group-max baseline (CoMLRL's `comlrl.trainers.reinforce.maremax`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MAReMaxConfig

__all__ = ["MAReMaxConfig", "MAReMaxTrainer"]


class MAReMaxTrainer(FacadeTrainer):
    """MAReMax with the reference's constructor (MAGRPO with another default advantage_mode)."""

    algorithm = "maremax"
    config_class = MAReMaxConfig
