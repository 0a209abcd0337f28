"""Centralized MAGRPO (CoMLRL 1.4.3's `comlrl.trainers.reinforce.centralized_magrpo`): one joint actor writes all
N role outputs in one completion and is trained with MAGRPO on the task reward of the split roles."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import CentralizedMAGRPOConfig

__all__ = ["CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer"]


class CentralizedMAGRPOTrainer(FacadeTrainer):
    """One actor (`agents=[model]` or `agent_model`), `num_agents` roles, a `centralized_adapter` (default: the
    tagged adapter) that builds the joint prompt and splits the joint completion; single turn."""

    algorithm = "magrpo"
    config_class = CentralizedMAGRPOConfig

    def __init__(self, *, centralized_adapter=None, num_agents: int = 2, agents=None, tokenizer=None,
                 reward_func=None, formatters=None, args=None, **kwargs):
        super().__init__(agents=agents, num_agents=num_agents, tokenizer=tokenizer, reward_func=reward_func,
                         formatters=formatters, args=args, centralized_adapter=centralized_adapter, **kwargs)
