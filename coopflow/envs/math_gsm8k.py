"""GSM8K math: a solver and a verifier, scored on the final number.

The stable import path for configs: `coopflow.envs.math_gsm8k:<name>`. The code lives in
`coopflow.stages.tasks.envs.math_gsm8k`."""

from coopflow.stages.tasks.envs.math_gsm8k import (  # noqa: F401
    gsm8k_file,
    gsm8k_item,
    gsm8k_splits,
    gsm8k_source,
    solver_prompt,
    verifier_prompt,
    final_number,
    judge,
    gsm8k_reward,
    eval_logger,
    eval_aggregator,
)

from coopflow.schemas.config.environment import Environment  # noqa: E402

GSM8K = Environment(
    name="gsm8k",
    description="GSM8K: a solver and a verifier agree on one final answer.",
    taskset="gsm8k",
    reward="coopflow.envs.math_gsm8k:gsm8k_reward",
    formatters=[
        {"function": "coopflow.envs.math_gsm8k:solver_prompt", "chat_template": True},
        {"function": "coopflow.envs.math_gsm8k:verifier_prompt", "chat_template": True},
    ],
    eval_logger="coopflow.envs.math_gsm8k:eval_logger",
    eval_aggregator="coopflow.envs.math_gsm8k:eval_aggregator",
)
"""`env: gsm8k`."""
