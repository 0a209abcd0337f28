"""The preference family: MADPO, MARLHF and their iterative (online) rounds."""

from coopflow.trainers.preference.iterative import (MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig,
                                                    MARLHFIterTrainer)
from coopflow.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from coopflow.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer

__all__ = ["JointRewardModel", "MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "MADPOIterConfig",
           "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]
