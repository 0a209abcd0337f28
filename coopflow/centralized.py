"""Centralized mode's role adapters by stable import path, for configs:

    centralized_adapter: coopflow.centralized:DelimitedAdapter

An adapter builds the joint actor's prompt from the roles' prompts and splits its completion back into one
output per role: `TaggedAdapter` (the default) uses one tagged block per role, `DelimitedAdapter` a separator
(a blank line by default). Your own class needs the same methods.
"""

from coopflow.stages.tasks.centralized import (  # noqa: F401
    CentralizedComparatorParseError,
    DelimitedAdapter,
    TaggedAdapter,
)
