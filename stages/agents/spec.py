"""What one agent is made of, as every backend takes it: `AgentSpec`.

A run opens its agents in this process (`models.load_policies`), in one worker process each
(`workers.WorkerPolicies`), as Ray actors (`ray_actors.RayPolicies`) or as LoRA adapters on one shared
base (`lora.load_lora_policies`). Each backend takes one `AgentSpec` per agent: where the weights come
from, how they are loaded and trained, and the optional parts of actor-critic runs and LoRA. Specs are
frozen, plain and picklable, so a worker process or a Ray actor receives its agent's spec as it is.
"""

from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class ValueHeadSpec:
    """IAC with a shared value head: a head on the actor's last hidden state (loaded from the agent's source
    dir when it holds `value_head.pt`, else new: `hidden_dim` wide, initialised from `seed`)."""

    hidden_dim: int | None
    seed: int


@dataclass(frozen=True)
class CriticSpec:
    """IAC with separate critics: this agent's own critic LM + value head, with its own AdamW."""

    source: str
    lr: float
    head_dim: int | None
    device: str
    seed: int
    optimizer_file: str | None = None  # the critic's AdamW state in a checkpoint, when resuming


@dataclass(frozen=True)
class LoraSpec:
    """The agent is adapter `index` on a frozen copy of `base` (`settings`: the LoRA settings as a dict); the
    adapter is new (initialised from `seed`) unless the agent's source is a stored adapter dir."""

    base: str
    index: int
    settings: dict
    seed: int


@dataclass(frozen=True)
class AgentSpec:
    """One agent to open.

    `source`: a model dir or hub id (a LoRA agent: its stored adapter dir, or the base for a new adapter);
    `lr`: the actor's AdamW learning rate; `dtype`, `attn`, `device`: how its weights load; `optimizer_file`:
    its AdamW state when resuming a checkpoint; `reference` (+ `reference_device`): the frozen model of the
    KL penalty (for LoRA: the base with the adapter disabled, any non-None value asks for it); `value_head` /
    `critic`: IAC's shared head or separate critic; `lora`: the agent as a LoRA adapter.
    """

    source: str
    lr: float
    dtype: str = "float32"
    attn: str | None = "sdpa"
    device: str = "cpu"
    optimizer_file: str | None = None
    reference: str | None = None
    reference_device: str | None = None
    value_head: ValueHeadSpec | None = None
    critic: CriticSpec | None = None
    lora: LoraSpec | None = None

    def with_(self, **changes) -> "AgentSpec":
        """A copy with some fields replaced."""
        return replace(self, **changes)


def specs_for(sources: list[str | Path], lr: float, dtype: str = "float32", attn: str | None = "sdpa",
              device: str | list[str] = "cpu", optimizer_files: list | None = None,
              references: list[str | None] | None = None) -> list[AgentSpec]:
    """One spec per source with shared settings (`device` may give one device per agent)."""
    n = len(sources)
    devices = [device] * n if isinstance(device, str) else list(device)
    opts = optimizer_files or [None] * n
    refs = references or [None] * n
    return [AgentSpec(str(s), lr, dtype, attn, devices[i], str(opts[i]) if opts[i] else None,
                      str(refs[i]) if refs[i] else None) for i, s in enumerate(sources)]
