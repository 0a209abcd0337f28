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
