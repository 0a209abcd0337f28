"""Built-in rewards by stable import path (`coopflow.rewards:length_ratio`), for configs and scripts.

Environment rewards live with their environment (`coopflow.envs.coding:humaneval_reward`, ...).
"""

from coopflow.stages.score.rewards import length_ratio  # noqa: F401
