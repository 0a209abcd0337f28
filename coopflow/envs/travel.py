"""Multi-turn travel booking (BFCL's travel API simulator): planner and executor, scored on the final state.

The stable import path for configs: `coopflow.envs.travel:<name>`. The code lives in
`coopflow.stages.tasks.envs.travel`."""

from coopflow.stages.tasks.envs.travel import (  # noqa: F401
    travel_items,
    travel_splits,
    travel_digest,
    simulator,
    execute,
    replay,
    expected_calls,
    ground_truth_state,
    planner_prompt,
    executor_prompt,
    travel_feedback,
    score_turn,
    travel_reward,
    eval_logger,
    eval_aggregator,
)
