"""KL to a frozen reference model, with the reference's helper names (`comlrl.utils.reference_kl`).

The estimator is Schulman's k3 summed over the response tokens, KL ≈ Σ_t [exp(ℓ_ref − ℓ_pol) − (ℓ_ref − ℓ_pol) − 1],
the one `stages.agents.reference_kl` uses when `reference_kl_enabled` is on.
"""

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from coopflow.stages.agents.logprobs import token_logprobs

__all__ = ["reference_kl_enabled", "reference_kl_coef", "validate_reference_kl_config", "resolve_reference_devices",
           "clone_reference_models", "load_reference_models_from_sources", "response_token_logprobs",
           "reference_kl_for_sequence"]


def reference_kl_enabled(args: Any) -> bool:
    """Whether a trainer config turns the KL penalty on."""
    return bool(getattr(args, "reference_kl_enabled", False))


def reference_kl_coef(args: Any) -> float:
    """The KL coefficient of a config (>= 0)."""
    coef = float(getattr(args, "reference_kl_coef", 0.0) or 0.0)
    if coef < 0:
        raise ValueError(f"reference_kl_coef must be >= 0, got {coef}")
    return coef


def validate_reference_kl_config(args: Any, expected_count: int) -> None:
    """Check the coefficient and that reference_devices names 1 or `expected_count` devices."""
    reference_kl_coef(args)
    devices = getattr(args, "reference_devices", None)
    if isinstance(devices, (list, tuple)) and len(devices) not in (1, expected_count):
        raise ValueError(f"reference_devices length ({len(devices)}) must be 1 or {expected_count}.")


def resolve_reference_devices(args: Any, fallback_devices: Sequence[torch.device],
                              expected_count: int) -> list[torch.device]:
    """Devices of the reference models: args.reference_devices (one broadcast, or one per model), else the
    fallback devices (one broadcast, or one per model)."""
    validate_reference_kl_config(args, expected_count)
    spec = getattr(args, "reference_devices", None)
    if spec is None:
        spec = list(fallback_devices)
    items = [spec] if isinstance(spec, (str, torch.device)) else list(spec)
    if len(items) not in (1, expected_count):
        raise ValueError(f"reference devices length ({len(items)}) must be 1 or {expected_count}.")
    devices = [torch.device(d) for d in items]
    return devices * expected_count if len(devices) == 1 else devices


def clone_reference_models(policy_models: Sequence[Any], *, devices: Sequence[torch.device]) -> list[Any]:
    """A frozen deep copy of every policy model on its reference device."""
    out = []
    for model, device in zip(policy_models, devices):
        ref = copy.deepcopy(model).to(device).eval()
        ref.requires_grad_(False)
        out.append(ref)
    return out


def load_reference_models_from_sources(model_sources: Sequence[str], *, devices: Sequence[torch.device],
                                       model_kwargs: Mapping[str, Any] | None = None) -> list[Any]:
    """Frozen reference models loaded from their sources (local dirs or hub ids)."""
    from transformers import AutoModelForCausalLM

    out = []
    for src, device in zip(model_sources, devices):
        ref = AutoModelForCausalLM.from_pretrained(src, **dict(model_kwargs or {})).to(device).eval()
        ref.requires_grad_(False)
        out.append(ref)
    return out


def response_token_logprobs(model: Any, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                            response_len: int) -> torch.Tensor:
    """[B, response_len] log-probs of the response tokens sequences[:, prompt_len:prompt_len + response_len]."""
    device = next(model.parameters()).device
    ids, mask = sequences.to(device), attention_mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    pred = logits[:, prompt_len - 1:prompt_len + response_len - 1]
    return token_logprobs(pred, ids[:, prompt_len:prompt_len + response_len])


@torch.no_grad()
def reference_kl_for_sequence(policy_model: Any, reference_model: Any, sequences: torch.Tensor,
                              attention_mask: torch.Tensor, prompt_len: int, response_len: int) -> torch.Tensor:
    """k3 KL of the policy to the reference over each sequence's response tokens: [B] (0 for identical models);
    response positions whose attention mask is 0 (padding) do not count."""
    modes = [(m, m.training) for m in (policy_model, reference_model)]
    try:  # no dropout: the same model gives the same log-probs
        for m, _ in modes:
            m.eval()
        pol = response_token_logprobs(policy_model, sequences, attention_mask, prompt_len, response_len)
        ref = response_token_logprobs(reference_model, sequences, attention_mask, prompt_len, response_len)
        ref = ref.to(pol.device)
    finally:
        for m, was in modes:
            m.train(was)
    keep = attention_mask[:, prompt_len:prompt_len + response_len].to(pol.device).bool()
    d = (ref - pol).double()
    return ((torch.exp(d) - d - 1) * keep).sum(-1).to(pol.dtype)
