"""Class completion (ClassEval, HumanEval pairs): each agent writes its assigned methods, scored in the sandbox.

The stable import path for configs: `coopflow.envs.completion:<name>`. The code lives in
`coopflow.stages.tasks.envs.completion`."""

from coopflow.stages.tasks.envs.completion import (  # noqa: F401
    pair_item,
    humaneval_pairs_splits,
    classeval_item,
    classeval_source,
    assigned,
    first_part_prompt,
    second_part_prompt,
    all_parts_prompt,
    assemble,
    score_joint,
    completion_reward,
    eval_logger,
    eval_aggregator,
)

from coopflow.schemas.config.environment import Environment  # noqa: E402

Completion = Environment(
    name="completion",
    description="Code completion: each agent completes its own stubs of one module.",
    taskset="completion-humaneval",
    reward="coopflow.envs.completion:completion_reward",
    formatters=[
        {"function": "coopflow.envs.completion:first_part_prompt", "chat_template": True},
        {"function": "coopflow.envs.completion:second_part_prompt", "chat_template": True},
    ],
    eval_logger="coopflow.envs.completion:eval_logger",
    eval_aggregator="coopflow.envs.completion:eval_aggregator",
)
"""`env: completion`."""
