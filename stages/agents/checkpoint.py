"""The checkpoint folder layout, in one place.

A checkpoint is a directory artifact holding everything a run needs to continue:

    agent_i/                  the agent's HF `save_pretrained` dir + tokenizer (+ value_head.pt for IAC's
                              shared value head); loadable with AutoModelForCausalLM.from_pretrained
    agent_i/critic/           IAC with separate critics: agent i's critic LM, tokenizer and value_head.pt
    critic/                   MAAC: the centralized critic (LM, tokenizer, value_head.pt)
    optimizer/agent_i.pt      AdamW state of agent i (and of its shared value head)
    optimizer/critic_i.pt     AdamW state of agent i's separate critic
    optimizer/critic.pt       AdamW state of MAAC's critic
    trainer_state.json        update, env_step and epoch of the last completed update; segment_keys and
                              segment_steps: the segments (end keys, steps keys) of the run that wrote it, which
                              `coopflow gc` and `rescore_from` follow (a run with another segmentation that reaches
                              the same policy shares the checkpoint and keeps its own steps under its own keys)

Every module that reads or writes a checkpoint goes through `CheckpointLayout`.

**Weights-only checkpoints.** A checkpoint holding the policy version `key` with its optimizer state is stored
under `key`; without it (everything but `optimizer/`) under `key-weights` (`weights_only_key`), so the two never
share a key. `trainer.checkpoint_optimizer` (see `stages.loops.run`) and `coopflow gc --keep-optimizer` replace
a full checkpoint by its weights-only copy (`drop_optimizer_state`); `find_checkpoint` finds either.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from coopflow.artifacts import ArtifactRef, ArtifactStore

WEIGHTS_ONLY = "-weights"
"""Suffix of the key of a checkpoint stored without its optimizer state."""


def weights_only_key(policy_key: str) -> str:
    """The key of the weights-only checkpoint of a policy version."""
    return policy_key + WEIGHTS_ONLY


def policy_key_of(checkpoint: ArtifactRef | str) -> str:
    """The policy version a checkpoint (ref or key) holds (with or without its optimizer state)."""
    return (checkpoint if isinstance(checkpoint, str) else checkpoint.key).removesuffix(WEIGHTS_ONLY)


def is_weights_only(ref: ArtifactRef | str) -> bool:
    """Whether a checkpoint (ref or key) was stored without optimizer state."""
    return (ref if isinstance(ref, str) else ref.key).endswith(WEIGHTS_ONLY)


def find_checkpoint(store: ArtifactStore, policy_key: str, optimizer: bool = False) -> ArtifactRef | None:
    """The stored checkpoint of a policy version: the full one, else (unless `optimizer`) the weights-only one."""
    full = store.find("checkpoint", policy_key)
    if full is not None or optimizer:
        return full
    return store.find("checkpoint", weights_only_key(policy_key))


def drop_optimizer_state(store: ArtifactStore, policy_key: str) -> ArtifactRef | None:
    """Replace the full checkpoint of `policy_key` by a weights-only one (hard links: no copy; the full one is
    removed once the other is committed). Returns the weights-only ref (None when neither is stored)."""
    full = store.find("checkpoint", policy_key)
    if full is None:
        return store.find("checkpoint", weights_only_key(policy_key))
    slim = store.put_subset("checkpoint", full, weights_only_key(policy_key),
                            lambda rel: not rel.startswith("optimizer/"))
    store.remove("checkpoint", policy_key)
    return slim


@dataclass(frozen=True)
class CheckpointLayout:
    """Paths inside one checkpoint directory `root`."""

    root: Path

    def agent(self, i: int) -> Path:
        return self.root / f"agent_{i}"

    def agent_optimizer(self, i: int) -> Path:
        return self.root / "optimizer" / f"agent_{i}.pt"

    def agent_critic(self, i: int) -> Path:
        return self.agent(i) / "critic"

    def agent_critic_optimizer(self, i: int) -> Path:
        return self.root / "optimizer" / f"critic_{i}.pt"

    def agent_files(self, i: int) -> list[Path]:
        """Every file of agent i's part (its dir, its optimizer states) that is there."""
        extra = [f for f in (self.agent_optimizer(i), self.agent_critic_optimizer(i)) if f.is_file()]
        return sorted(p for p in self.agent(i).rglob("*") if p.is_file()) + extra

    @property
    def central_critic(self) -> Path:
        return self.root / "critic"

    @property
    def central_critic_optimizer(self) -> Path:
        return self.root / "optimizer" / "critic.pt"

    @property
    def optimizer_dir(self) -> Path:
        return self.root / "optimizer"

    @property
    def trainer_state_file(self) -> Path:
        return self.root / "trainer_state.json"

    def trainer_state(self) -> dict:
        """The stored trainer state ({} when the checkpoint has none)."""
        f = self.trainer_state_file
        return json.loads(f.read_text()) if f.is_file() else {}

    def write_trainer_state(self, state: dict) -> None:
        self.trainer_state_file.write_text(json.dumps(state, indent=1, sort_keys=True))

    def sources(self, n_agents: int) -> tuple[list[Path], list[Path], dict]:
        """(agent dirs, agent optimizer files, trainer state): what loading the agents back needs."""
        return ([self.agent(i) for i in range(n_agents)], [self.agent_optimizer(i) for i in range(n_agents)],
                self.trainer_state())
