"""Tokenizer helpers with the reference's names (`comlrl.utils.tokenizer_utils`)."""

from collections.abc import Sequence
from typing import Any

__all__ = ["ensure_pad_token", "ensure_tokenizer", "resolve_tokenizers", "apply_tokenizer_specials"]


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give a tokenizer without a pad token its EOS as pad; a tokenizer with neither is refused."""
    if getattr(tokenizer, "pad_token", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise ValueError("Tokenizer must expose pad_token_id (it has neither a pad nor an EOS token).")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ValueError("Tokenizer must expose pad_token_id.")
    return tokenizer


def ensure_tokenizer(model: Any, tokenizer: Any | None) -> Any:
    """The given tokenizer, else the one of `model` (a source string), with a pad token."""
    if tokenizer is None:
        if not isinstance(model, str):
            raise ValueError("tokenizer must be provided when the model is given as an object")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    return ensure_pad_token(tokenizer)


def resolve_tokenizers(model: Any, tokenizer: Any, agents: Sequence[object] | None) -> Any:
    """One tokenizer (homogeneous: from `tokenizer` or `model`) or a list with one per agent."""
    if isinstance(tokenizer, (list, tuple)):
        if agents is not None and len(tokenizer) != len(agents):
            raise ValueError(f"tokenizers length ({len(tokenizer)}) must match agents ({len(agents)}).")
        return [ensure_pad_token(t) for t in tokenizer]
    if tokenizer is None and model is None and agents:
        return [ensure_tokenizer(a, None) for a in agents]
    return ensure_tokenizer(model, tokenizer)


def apply_tokenizer_specials(tokenizer: Any, models: Sequence[object]) -> None:
    """Copy the tokenizer's pad / EOS ids into every model's (generation) config."""
    for m in models:
        for cfg in (getattr(m, "config", None), getattr(m, "generation_config", None)):
            if cfg is None:
                continue
            if getattr(tokenizer, "pad_token_id", None) is not None:
                cfg.pad_token_id = tokenizer.pad_token_id
            if getattr(tokenizer, "eos_token_id", None) is not None:
                cfg.eos_token_id = tokenizer.eos_token_id
