"""Per-agent LoRA on one shared, frozen base model (`agents.lora`).

N full copies of a model cost N × its weights plus N × AdamW's two moments. With LoRA the agents share
one frozen base in memory and each owns a small adapter (rank-r updates of the attention projections):

- the base is loaded once and wrapped by PEFT; agent i's adapter is named `agent_i` and is initialised
  from a seed derived from the run's seed and i (LoRA's B starts at zero, so every agent starts as
  the base);
- before each per-agent op the group activates that agent's adapter (`AgentState.activate`); its
  optimizer holds only that adapter's parameters;
- the frozen reference of the KL penalty is the same base with adapters disabled (`BaseView`): no
  copy;
- a checkpoint's `agent_i/` holds the adapter only (`adapter_model.safetensors`, `adapter_config.json`
  in PEFT's format, `coopflow_lora.json` naming the base) and the tokenizer;
  `coopflow merge-lora CKPT OUT` writes full HF model dirs (base + adapter merged) for deployment.

In-process (`parallel_training: none`) the N adapters share one base. With worker processes (`mp`) or
Ray actors (`ray`) each agent lives elsewhere, so each loads its own copy of the (frozen) base and one
adapter — the saving is then the optimizer state and checkpoints, not the base's weights; the adapter
starts from the same seeded init as in-process, so every mode trains the same adapters.

Actor-critic (IAC/MAAC): the actors are adapters; a shared-mode value head sits on the adapted actor
and trains with its adapter; separate critics (IAC `use_separate_critic`, MAAC's central critic) are
full models from `critic.model`, trained in full (pick a small one).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from coopflow.artifacts import faults
from coopflow.stages.agents.models import is_adapter_dir, load_merged, save_tokenizer
from coopflow.stages.agents.state import AgentState, Policies
from coopflow.stages.agents.spec import AgentSpec, LoraSpec

# PEFT still asks transformers 5 for a renamed attribute; nothing for a user to act on
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


def _peft_config(settings):
    from peft import LoraConfig

    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM")


class BaseView:
    """The base model with every adapter disabled: the frozen reference, without a copy."""

    def __init__(self, peft_model):
        self._m = peft_model

    def __call__(self, *args, **kwargs):
        with self._m.disable_adapter():
            return self._m(*args, **kwargs)

    def __getattr__(self, name):  # device, dtype, config, ... of the shared model
        return getattr(self._m, name)


def _activate(model, name: str):
    def activate() -> None:
        if model.active_adapter != name:
            model.set_adapter(name)
    return activate


def _add_adapter(peft, model, settings, index: int, src: str | None, seed: int, device: str):
    """Add agent `index`'s adapter (seeded init; the stored weights of `src` when it is an adapter dir)."""
    from peft import get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    from coopflow.stages.common.seeds import derive_seed

    name = f"agent_{index}"
    with torch.random.fork_rng(devices=[]):  # the same init wherever the agent lives (in-process, worker, actor)
        torch.manual_seed(derive_seed(seed, f"lora-{index}"))
        if peft is None:
            peft = get_peft_model(model, _peft_config(settings), adapter_name=name)
        else:
            peft.add_adapter(name, _peft_config(settings))
    if src is not None:
        set_peft_model_state_dict(peft, load_file(str(Path(src) / "adapter_model.safetensors"), device=device),
                                  adapter_name=name)
    return peft


def _agent(peft, tok, index: int, lr: float, with_reference: bool, base: str) -> AgentState:
    name = f"agent_{index}"
    params = [p for n, p in peft.named_parameters() if f".{name}." in n]
    for p in params:
        p.requires_grad_(True)
    return AgentState(peft, tok, lr, reference=BaseView(peft) if with_reference else None, adapter=name,
                      trainable=params, activate=_activate(peft, name), base_source=str(base))


def _settings(settings):
    from coopflow.schemas.config import LoraSettings

    return settings if isinstance(settings, LoraSettings) else LoraSettings.model_validate(settings)


def load_lora_policies(specs: list[AgentSpec]) -> Policies:
    """N agents as adapters on one base in this process (every spec's `lora.base`, loaded with the first spec's
    dtype, kernel and device); agent i's adapter is its stored adapter dir (`source`) or new."""
    from coopflow.stages.agents.models import attach_actor_critic, load_agent, load_optimizer_state

    first = specs[0]
    base = first.lora.base
    model, tok = load_agent(base, first.dtype, first.attn, first.device)
    model.requires_grad_(False)
    peft = None
    for i, spec in enumerate(specs):
        stored = spec.source if is_adapter_dir(spec.source) else None
        peft = _add_adapter(peft, model, _settings(spec.lora.settings), i, stored, spec.lora.seed, first.device)
    peft.eval()
    agents = []
    for i, spec in enumerate(specs):
        agent = _agent(peft, tok, i, spec.lr, spec.reference is not None, base)
        attach_actor_critic(agent, spec.source if is_adapter_dir(spec.source) else base, spec)
        load_optimizer_state(agent, spec.optimizer_file, first.device)
        agents.append(agent)
    agents[0].activate()
    return Policies(agents)


def load_lora_agent(spec: AgentSpec) -> AgentState:
    """One LoRA agent on its own copy of the base (a worker process or Ray actor holds one agent).

    The adapter is initialised exactly as in-process (same name, same seed), so the agent starts from the same
    weights; the frozen KL reference is the base with the adapter disabled.
    """
    from coopflow.stages.agents.models import attach_actor_critic, load_agent, load_optimizer_state

    lora = spec.lora
    model, tok = load_agent(lora.base, spec.dtype, spec.attn, spec.device)
    model.requires_grad_(False)
    faults.hit("prepare")
    peft = _add_adapter(None, model, _settings(lora.settings), lora.index,
                        spec.source if is_adapter_dir(spec.source) else None, lora.seed, spec.device)
    peft.eval()
    agent = _agent(peft, tok, lora.index, spec.lr, spec.reference is not None, lora.base)
    attach_actor_critic(agent, spec.source, spec)
    load_optimizer_state(agent, spec.optimizer_file, spec.device)
    return agent


def lora_specs(specs: list[AgentSpec], base: str, settings, seed: int) -> list[AgentSpec]:
    """The agents' specs as LoRA adapters on `base` (agent i: adapter i)."""
    lora = _settings(settings).model_dump(mode="json")
    return [s.with_(lora=LoraSpec(str(base), i, lora, seed)) for i, s in enumerate(specs)]


def merge_checkpoint(checkpoint: str | Path, out: str | Path, base: str | None = None) -> list[Path]:
    """Write each LoRA agent of `checkpoint` as a full HF model dir `out/agent_i` (base + adapter merged)."""
    ckpt, out = Path(checkpoint), Path(out)
    agents = sorted(p for p in ckpt.glob("agent_*") if p.is_dir())
    if not agents or not all(is_adapter_dir(a) for a in agents):
        raise ValueError(f"{ckpt} holds no LoRA agents (agent_i/adapter_config.json): nothing to merge")
    written = []
    for a in agents:
        model, tok = load_merged(a, base=base)
        model.save_pretrained(out / a.name)
        save_tokenizer(tok, out / a.name)
        written.append(out / a.name)
    return written
