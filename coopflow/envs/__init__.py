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

from coopflow.schemas.config.environment import Environment  # noqa: E402,F401

ENVIRONMENTS: dict[str, str] = {
    "story": "coopflow.envs.writing:Story",
    "tldr": "coopflow.envs.writing:TLDR",
    "arxiv": "coopflow.envs.arxiv:Arxiv",
    "humaneval": "coopflow.envs.coding:HumanEval",
    "completion": "coopflow.envs.completion:Completion",
    "gsm8k": "coopflow.envs.math_gsm8k:GSM8K",
    "bfcl": "coopflow.envs.tooluse:BFCL",
    "travel": "coopflow.envs.travel:Travel",
}
"""The shipped environments by name: `env: <name>` in a config (each also importable by its path)."""

__all__ = ["ENVIRONMENTS", "Environment"]
