"""The live agents of a run: per-agent state, the policy-group protocol and its in-process container.

A *per-agent op* is a module-level function `op(agent: AgentState, *args) -> result` with plain
picklable arguments and results (generation, a policy-gradient step, DPO deltas, saving, ...). The
stages never touch the models directly: they hand their op and one argument tuple per agent to a
`PolicyGroup`, which runs it on every agent and returns the results in agent order. `Policies` runs
the ops here, one agent after the other; `stages.agents.workers.WorkerPolicies` runs them in one
process per agent (the op is pickled by reference, so the worker imports the module that defines it).
"""

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol

import torch

from coopflow.stages.agents.attention import use_wide_attention

# --- writes beside the next phase ------------------------------------------------------------------------------
# A checkpoint is written on writer threads of the process that holds the agents (stages.agents.models.begin_save),
# reading the live weights and optimizer state in place while generation or evaluation goes on: nothing may change
# them until the write has ended, so whatever steps an optimizer gets it from `ensure_optimizer`, which waits.

_WRITER: ThreadPoolExecutor | None = None
_WRITER_LOCK = threading.Lock()
_WRITES: list[Future] = []  # this process's writes that may still be running


def write_beside(fn: Callable, *args) -> Future:
    """Run `fn(*args)` on this process's writer threads (up to 4: the agents of an in-process group side by side)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            _WRITER = ThreadPoolExecutor(4, thread_name_prefix="coopflow-checkpoint")
        future = _WRITER.submit(fn, *args)
        _WRITES.append(future)
    return future


def wait_for_writes() -> None:
    """Block until this process's checkpoint writes have ended (their errors are reported by whoever collects them,
    `stages.agents.models.finish_save`)."""
    with _WRITER_LOCK:
        running = list(_WRITES)
        _WRITES.clear()
    if running:
        wait(running)


@dataclass
class AgentState:
    """One live agent: its model, tokenizer and (after the first update) AdamW optimizer."""

    model: object
    tokenizer: object
    lr: float
    optimizer: object = None
    reference: object = None  # frozen reference model for the KL penalty (None when KL is off)
    value_head: object = None  # IAC shared mode: a value head on the actor (one optimizer over both)
    critic: "CriticState | None" = None  # IAC separate mode: this agent's own critic LM + head
    adapter: str | None = None  # LoRA (stages.agents.lora): this agent's adapter on a base shared with the others
    trainable: list | None = None  # LoRA: the parameters this agent trains (its adapter's); None = requires_grad
    activate: Callable[[], None] | None = None  # LoRA: make this agent's adapter the active one
    base_source: str | None = None  # LoRA: the shared base model's source
    compute_dtype: str | None = None  # agents.compute_dtype (resolved): the loss passes' autocast dtype; None = off
    writing: Future | None = None  # its part of a checkpoint being written beside the next phase (begin_save)

    def autocast(self):
        """The loss forward's autocast context (`compute_dtype`), or a no-op."""
        if self.compute_dtype in (None, "model"):
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=getattr(torch, self.compute_dtype))

    def ensure_optimizer(self):
        """Per-agent AdamW (the reference's optimizer; fused kernels where torch has them), once no checkpoint write
        reads the weights any more (every update gets its optimizer here)."""
        wait_for_writes()
        if self.optimizer is None:
            params = (list(self.trainable) if self.trainable is not None
                      else [p for p in self.model.parameters() if p.requires_grad])
            if self.value_head is not None:
                params += list(self.value_head.parameters())
            self.optimizer = adamw(params, self.lr)
        return self.optimizer


def adamw(params: list, lr: float):
    """AdamW with the reference's defaults (fused kernels where torch has them)."""
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=lr)


@dataclass
class CriticState:
    """A critic: causal LM backbone + value head, its tokenizer and AdamW (lr = critic_learning_rate)."""

    model: object
    head: object
    tokenizer: object
    lr: float
    optimizer: object = None
    same_vocab: bool = True  # shares the actor's vocabulary: reuse its token ids instead of re-tokenizing

    def ensure_optimizer(self):
        """AdamW over the backbone and head, once no checkpoint write reads them any more."""
        wait_for_writes()
        if self.optimizer is None:
            self.optimizer = adamw([p for p in self.model.parameters() if p.requires_grad]
                                   + list(self.head.parameters()), self.lr)
        return self.optimizer


class PolicyGroup(Protocol):
    """What the stages need of the live agents: their count, tokenizers, per-agent ops, a run state."""

    state: dict  # update, env_step, ... of the last completed update
    critic: "CriticState | None"  # MAAC's centralized critic (in the main process), else None

    @property
    def n(self) -> int: ...

    @property
    def tokenizers(self) -> list: ...

    def run(self, op: Callable, per_agent_args: list[tuple]) -> list: ...

    def close(self) -> None: ...


@dataclass
class Policies:
    """Live agents of one run, in this process; `run(op, args)` applies a per-agent op to each in order.

    `stages.agents.workers.WorkerPolicies` has the same interface with one process per agent.
    """

    agents: list[AgentState]
    state: dict = field(default_factory=dict)  # update, env_step, ... of the last completed update
    critic: "CriticState | None" = None  # MAAC's centralized critic (lives in the main process)

    @property
    def n(self) -> int:
        return len(self.agents)

    @property
    def tokenizers(self) -> list:
        return [a.tokenizer for a in self.agents]

    def run(self, op: Callable, per_agent_args: list[tuple]) -> list:
        """Apply the per-agent op `op(agent, *args)` to every agent; results in agent order."""
        out = []
        for agent, args in zip(self.agents, per_agent_args):
            if agent.activate is not None:  # LoRA agents share one model: switch to this agent's adapter
                agent.activate()
            out.append(op(agent, *args))
        return out

    def close(self) -> None:
        """Release resources (nothing to do in-process)."""


def set_compute_dtype(agent: AgentState, name: str | None) -> None:
    """Per-agent op: the dtype its loss passes autocast to (a run setting, wherever the agent lives), and the
    attention its models run with it (float32 where bf16 attention is the slower kernel, `attention`)."""
    agent.compute_dtype = None if name in (None, "model") else name
    for model in (agent.model, agent.reference, getattr(agent.critic, "model", None)):
        use_wide_attention(model, agent.compute_dtype)


def _only(agent, go: bool, op: Callable, *args):
    """Run `op` on this agent when `go`, else nothing (lets a group run an op on one of its agents)."""
    return op(agent, *args) if go else None


@dataclass
class OneAgent:
    """Agent `index` of a policy group, seen as a group of one (e.g. a centralized comparator that writes every
    role with one of the comparator's models); works in-process and with worker processes."""

    group: object
    index: int
    state: dict = field(default_factory=dict)
    critic: "CriticState | None" = None

    @property
    def n(self) -> int:
        return 1

    @property
    def tokenizers(self) -> list:
        return [self.group.tokenizers[self.index]]

    def run(self, op: Callable, per_agent_args: list[tuple]) -> list:
        args = [(i == self.index, op, *per_agent_args[0]) for i in range(self.group.n)]
        return [self.group.run(_only, args)[self.index]]

    def close(self) -> None:
        """The group owns the agent: nothing to release here."""
