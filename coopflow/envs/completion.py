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
