"""Iterative (online) MADPO and MARLHF rounds (CoMLRL's `comlrl.trainers.preference.iterative`)."""

from coopflow.trainers.preference.marlhf import MARLHFTrainer
from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MADPOIterConfig, MARLHFIterConfig

__all__ = ["MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]


class MADPOIterTrainer(FacadeTrainer):
    """Rounds of target-vs-comparator pairs, replay and DPO; rounds resume from the artifact store."""

    algorithm = "madpo-iter"
    config_class = MADPOIterConfig


class MARLHFIterTrainer(MARLHFTrainer):
    """Rounds of pairs, a fresh reward model per round and the RL backend on it."""

    algorithm = "marlhf-iter"
    config_class = MARLHFIterConfig
