"""Centralized comparator adapters (CoMLRL's `comlrl.trainers.preference.centralized`): the protocol, the tagged
default and its parse error, over `stages.tasks.centralized`."""

from typing import Protocol, runtime_checkable

from coopflow.stages.tasks.centralized import CentralizedComparatorParseError, TaggedAdapter

__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter"]


@runtime_checkable
class CentralizedComparatorAdapter(Protocol):
    """What a centralized adapter provides (the sequential pair is optional)."""

    def build_prompt(self, batch_item: dict, agent_prompts: list[str]) -> str: ...

    def parse_completion(self, completion: str, batch_item: dict, num_agents: int) -> list[str]: ...


class TaggedCentralizedComparatorAdapter(TaggedAdapter):
    """The default adapter: role prompts listed as 'Agent i original prompt:', outputs in <agent_i>...</agent_i>
    sections (case-insensitive; a missing section is "", none at all raises CentralizedComparatorParseError)."""
