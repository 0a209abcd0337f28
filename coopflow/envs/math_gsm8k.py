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
