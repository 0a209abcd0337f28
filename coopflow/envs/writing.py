"""Writing (TL;DR-style summaries): a short and a long summary, rewarded for their length ratio.

The stable import path for configs: `coopflow.envs.writing:<name>`. The code lives in
`coopflow.stages.tasks.envs.writing`."""

from coopflow.stages.tasks.envs.writing import (  # noqa: F401
    tldr_mini_splits,
    dual_length_reward,
    length_metrics,
    eval_logger,
    eval_aggregator,
)
