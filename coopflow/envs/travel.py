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

from coopflow.schemas.config.environment import Environment  # noqa: E402

Travel = Environment(
    name="travel",
    description="Travel booking against a simulator: a planner and an executor, over turns.",
    taskset="travel-bfcl",
    reward="coopflow.envs.travel:travel_reward",
    formatters=[
        {"function": "coopflow.envs.travel:planner_prompt", "chat_template": True},
        {"function": "coopflow.envs.travel:executor_prompt", "chat_template": True},
    ],
    transition="coopflow.envs.travel:travel_feedback",
    eval_logger="coopflow.envs.travel:eval_logger",
    eval_aggregator="coopflow.envs.travel:eval_aggregator",
)
"""`env: travel`."""
