"""Writing an introduction from an arXiv abstract: background and method parts, level-based reward.

The stable import path for configs: `coopflow.envs.arxiv:<name>`. The code lives in
`coopflow.stages.tasks.envs.arxiv`."""

from coopflow.stages.tasks.envs.arxiv import (  # noqa: F401
    abstract_of,
    arxiv_mini_splits,
    arxiv_source,
    background_prompt,
    method_prompt,
    transition_categories,
    arxiv_levels,
    arxiv_reward,
    eval_logger,
    eval_aggregator,
)
