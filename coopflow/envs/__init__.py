"""The environments shipped with coopflow, by stable import path: what a config names.

    reward:
      name: coopflow.envs.coding:humaneval_reward
    formatters:
      - function: coopflow.envs.coding:helper_prompt
      - function: coopflow.envs.coding:main_prompt

One module per environment: `arxiv`, `coding`, `completion`, `expert`, `math_gsm8k`, `tooluse`, `travel`,
`writing`. Each exposes its rewards, role prompts, multi-turn feedback, eval hooks and task sources; the
code itself lives in `coopflow.stages.tasks.envs`, whose paths may change between releases.
"""
