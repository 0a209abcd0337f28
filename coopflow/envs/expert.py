"""Expert edits: a multi-turn transition where an external expert model edits the agents' code.

The stable import path for configs: `coopflow.envs.expert:<name>`. The code lives in
`coopflow.stages.tasks.envs.expert`."""

from coopflow.stages.tasks.envs.expert import (  # noqa: F401
    expert_request,
    parse_edits,
    ExpertEdits,
)
