"""The preference family: MADPO, MARLHF and their iterative (online) rounds, with centralized collaboration."""

from coopflow.trainers.preference.centralized import (CentralizedComparatorAdapter, CentralizedComparatorParseError,
                                                      TaggedCentralizedComparatorAdapter)
from coopflow.trainers.preference.collaboration import CentralizedCollaboration
from coopflow.trainers.preference.iterative import (MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig,
                                                    MARLHFIterTrainer)
from coopflow.trainers.preference.madpo import MADPOConfig, MADPOTrainer
from coopflow.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer

__all__ = ["JointRewardModel", "MADPOConfig", "MADPOTrainer", "MARLHFConfig", "MARLHFTrainer", "MADPOIterConfig",
           "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer", "TaggedCentralizedComparatorAdapter",
           "CentralizedComparatorAdapter", "CentralizedComparatorParseError", "CentralizedCollaboration"]
