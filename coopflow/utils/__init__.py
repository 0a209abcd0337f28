"""Utilities with the reference's import paths (`comlrl.utils.*`)."""

from coopflow.utils.formatters import build_formatters
from coopflow.utils.model_loading import infer_model_name, resolve_model_sources
from coopflow.utils.reference_kl import (clone_reference_models, load_reference_models_from_sources,
                                         reference_kl_coef, reference_kl_enabled, reference_kl_for_sequence,
                                         resolve_reference_devices, validate_reference_kl_config)
from coopflow.utils.reward_processor import RewardProcessors
from coopflow.utils.reward_utils import (call_reward_function, normalize_reward_lengths, resolve_reward_range,
                                         set_reward_range)
from coopflow.utils.tokenizer_utils import (apply_tokenizer_specials, ensure_pad_token, ensure_tokenizer,
                                            resolve_tokenizers)

__all__ = ["build_formatters", "ensure_pad_token", "ensure_tokenizer", "apply_tokenizer_specials", "resolve_tokenizers",
           "infer_model_name", "resolve_model_sources", "clone_reference_models", "load_reference_models_from_sources",
           "reference_kl_coef", "reference_kl_enabled", "reference_kl_for_sequence", "resolve_reference_devices",
           "validate_reference_kl_config", "RewardProcessors", "call_reward_function", "normalize_reward_lengths",
           "resolve_reward_range", "set_reward_range", "unwrap_model", "read_checkpoint_metadata"]


def unwrap_model(model):
    """The model inside a DDP / compile wrapper (`.module` / `._orig_mod`), else the model itself."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or getattr(model, "_orig_mod")
    return model


def read_checkpoint_metadata(path) -> dict:
    """The trainer state a coopflow checkpoint (or a saved agent dir's parent) records: update, env_step, ..."""
    import json
    from pathlib import Path

    p = Path(path)
    for f in (p / "trainer_state.json", p.parent / "trainer_state.json"):
        if f.is_file():
            return json.loads(f.read_text())
    raise FileNotFoundError(f"no trainer_state.json in {p} or its parent (not a coopflow checkpoint)")
