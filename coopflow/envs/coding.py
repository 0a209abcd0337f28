"""Cooperative coding (HumanEval, CoopHumanEval, MBPP): a helper and a main function, scored in the sandbox.

The stable import path for configs: `coopflow.envs.coding:<name>`. The code lives in
`coopflow.stages.tasks.envs.coding`."""

from coopflow.stages.tasks.envs.coding import (  # noqa: F401
    humaneval_file,
    humaneval_splits,
    mbpp_item,
    mbpp_source,
    coop_item,
    coop_source,
    helper_prompt,
    main_prompt,
    solo_prompt,
    extract_code,
    counted_check,
    tally_footer,
    counted_test,
    build_program,
    score_run,
    score_joint,
    humaneval_reward,
    sliced_test,
    diagnose,
    level_feedback,
    eval_logger,
    pass_at_k,
    eval_aggregator,
)

from coopflow.schemas.config.environment import Environment  # noqa: E402

HumanEval = Environment(
    name="humaneval",
    description="HumanEval: a helper function and the main function, tested in the sandbox.",
    taskset="humaneval",
    reward="coopflow.envs.coding:humaneval_reward",
    formatters=[
        {"function": "coopflow.envs.coding:helper_prompt", "chat_template": True},
        {"function": "coopflow.envs.coding:main_prompt", "chat_template": True},
    ],
    eval_logger="coopflow.envs.coding:eval_logger",
    eval_aggregator="coopflow.envs.coding:eval_aggregator",
)
"""`env: humaneval`."""
