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

from coopflow.schemas.config.environment import Environment  # noqa: E402

Story = Environment(
    name="story",
    description="Story length ratio: agent 2 writes a story 2-3x longer (in characters) than agent 1's.",
    taskset="story-length-ratio",
    reward="length_ratio",
)
"""`env: story`."""

TLDR = Environment(
    name="tldr",
    description="TL;DR of a post: a short (~220 characters) and a detailed summary 2-3x longer.",
    taskset="tldr-mini",
    reward="coopflow.envs.writing:dual_length_reward",
    formatters=[
        {"chat_template": True, "system_prompt": "Summarise the user's post as a short TL;DR of about 220 "
                                                 "characters. Reply with the TL;DR only."},
        {"chat_template": True, "system_prompt": "Summarise the user's post as a detailed TL;DR, two to three "
                                                 "times longer than a short one. Reply with the TL;DR only."},
    ],
    eval_logger="coopflow.envs.writing:eval_logger",
    eval_aggregator="coopflow.envs.writing:eval_aggregator",
)
"""`env: tldr`."""
