"""The environments shipped with coopflow: what a config names.

An environment as one name (`coopflow.schemas.config.environment` explains the merge):

    env: humaneval            # taskset, reward, both role prompts and the eval hooks of HumanEval

or any single part by its stable import path:

    reward:
      name: coopflow.envs.coding:humaneval_reward
    formatters:
      - function: coopflow.envs.coding:helper_prompt
      - function: coopflow.envs.coding:main_prompt

One module per environment: `arxiv`, `coding`, `completion`, `expert`, `math_gsm8k`, `tooluse`, `travel`,
`writing`. Each exposes its rewards, role prompts, multi-turn feedback, eval hooks and task sources; the
code itself lives in `coopflow.stages.tasks.envs`, whose paths may change between releases.
"""

from coopflow.schemas.config.environment import ENVIRONMENTS, Environment  # noqa: E402,F401

__all__ = ["ENVIRONMENTS", "Environment"]
