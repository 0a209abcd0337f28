"""Every trainer and config class, as `comlrl.trainers` exports them."""

from coopflow.trainers.actor_critic import (ActorCriticTrainerBase, IACConfig, IACTrainer, MAACConfig,
                                           MAACTrainer)
from coopflow.trainers.preference import (JointRewardModel, MADPOConfig, MADPOIterConfig, MADPOIterTrainer,
                                          MADPOTrainer, MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer,
                                          MARLHFTrainer)
from coopflow.trainers.reinforce import (CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, MAGRPOConfig,
                                         MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MARLOOConfig,
                                         MARLOOTrainer, MAReMaxConfig, MAReMaxTrainer)

__all__ = ["ActorCriticTrainerBase", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "IACConfig", "IACTrainer",
           "MAACConfig", "MAACTrainer", "JointRewardModel", "MADPOConfig", "MADPOTrainer", "MARLHFConfig",
           "MARLHFTrainer", "MADPOIterConfig", "MADPOIterTrainer", "MARLHFIterConfig", "MARLHFIterTrainer",
           "MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer", "MARLOOConfig",
           "MARLOOTrainer", "MAReMaxConfig", "MAReMaxTrainer"]
