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

In-process only (`parallel_training: none`): worker processes would each need their own base.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from stages.agents.models import is_adapter_dir, load_merged
from stages.agents.state import AgentState, Policies

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


def load_lora_policies(base: str, adapters: list[str | None], settings, lr: float, dtype: str,
                       attn: str | None, device: str, optimizer_files: list | None, with_reference: bool,
                       seed: int) -> Policies:
    """N agents as adapters on one base (`adapters[i]`: a stored adapter dir, or None for a new one)."""
    from peft import get_peft_model

    from stages.agents.models import load_agent, load_tensors
    from stages.common.seeds import derive_seed

    model, tok = load_agent(base, dtype, attn, device)
    model.requires_grad_(False)
    cfg = _peft_config(settings)
    peft = None
    for i, src in enumerate(adapters):
        name = f"agent_{i}"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, f"lora-{i}"))
            if peft is None:
                peft = get_peft_model(model, cfg, adapter_name=name)
            else:
                peft.add_adapter(name, cfg)
        if src is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(peft, load_file(str(Path(src) / "adapter_model.safetensors"), device=device),
                                      adapter_name=name)
    peft.eval()
    agents = []
    for i in range(len(adapters)):
        name = f"agent_{i}"
        params = [p for n, p in peft.named_parameters() if f".{name}." in n]
        for p in params:
            p.requires_grad_(True)
        agent = AgentState(peft, tok, lr, reference=BaseView(peft) if with_reference else None,
                           adapter=name, trainable=params, activate=_activate(peft, name), base_source=str(base))
        opt = (optimizer_files or [None] * len(adapters))[i]
        if opt is not None and Path(opt).is_file():
            agent.ensure_optimizer().load_state_dict(load_tensors(opt, device))
        agents.append(agent)
    agents[0].activate()
    return Policies(agents)


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
        tok.save_pretrained(out / a.name)
        written.append(out / a.name)
    return written
