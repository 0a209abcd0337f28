"""Tool use (BFCL v4): a planner and an executor writing function calls, scored against the expected calls.

The stable import path for configs: `coopflow.envs.tooluse:<name>`. The code lives in
`coopflow.stages.tasks.envs.tooluse`."""

from coopflow.stages.tasks.envs.tooluse import (  # noqa: F401
    bfcl_data_dir,
    bfcl_items,
    bfcl_source,
    planner_prompt,
    executor_prompt,
    parse_calls,
    value_matches,
    call_score,
    match_calls,
    plan_f1,
    score_answer,
    bfcl_reward,
    eval_logger,
    eval_aggregator,
)

from coopflow.schemas.config.environment import Environment  # noqa: E402

BFCL = Environment(
    name="bfcl",
    description="Tool use (BFCL v4): a planner and an executor write the function calls.",
    taskset="bfcl",
    reward="coopflow.envs.tooluse:bfcl_reward",
    formatters=[
        {"function": "coopflow.envs.tooluse:planner_prompt", "chat_template": True},
        {"function": "coopflow.envs.tooluse:executor_prompt", "chat_template": True},
    ],
    eval_logger="coopflow.envs.tooluse:eval_logger",
    eval_aggregator="coopflow.envs.tooluse:eval_aggregator",
)
"""`env: bfcl`."""
