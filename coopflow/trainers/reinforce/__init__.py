"""The critic-free family: MAGRPO, MAREINFORCE, MARLOO, MAReMax, and centralized MAGRPO."""

from coopflow.trainers.reinforce.centralized_magrpo import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from coopflow.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
from coopflow.trainers.reinforce.mareinforce import MAREINFORCEConfig, MAREINFORCETrainer
from coopflow.trainers.reinforce.maremax import MAReMaxConfig, MAReMaxTrainer
from coopflow.trainers.reinforce.marloo import MARLOOConfig, MARLOOTrainer

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer", "MARLOOConfig",
           "MARLOOTrainer", "MAReMaxConfig", "MAReMaxTrainer", "CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]
