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

from coopflow.schemas.config.environment import Environment  # noqa: E402

Arxiv = Environment(
    name="arxiv",
    description="arXiv introductions: background and motivation; method and implications.",
    taskset="arxiv-mini",
    reward="coopflow.envs.arxiv:arxiv_reward",
    formatters=[
        {"function": "coopflow.envs.arxiv:background_prompt", "chat_template": True},
        {"function": "coopflow.envs.arxiv:method_prompt", "chat_template": True},
    ],
    eval_logger="coopflow.envs.arxiv:eval_logger",
    eval_aggregator="coopflow.envs.arxiv:eval_aggregator",
)
"""`env: arxiv`."""
