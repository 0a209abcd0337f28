"""Model-source helpers with the reference's names (`comlrl.utils.model_loading`)."""

from collections.abc import Sequence
from typing import Any

__all__ = ["resolve_model_kwargs", "freeze_model", "infer_model_name", "resolve_model_sources"]


def resolve_model_kwargs(model_config: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """from_pretrained keyword arguments from a trainer's model_config (its torch_dtype / attn_implementation,
    or those under 'model_kwargs'), overrides last; attention defaults to 'sdpa'."""
    cfg = dict(model_config or {}) if not hasattr(model_config, "__dict__") or isinstance(model_config, dict) \
        else dict(vars(model_config))
    out = dict(cfg.get("model_kwargs") or {})
    for key in ("torch_dtype", "dtype", "attn_implementation"):
        if key in cfg:
            out[key] = cfg[key]
    out.update(overrides or {})
    out.setdefault("attn_implementation", "sdpa")
    return out


def freeze_model(model: Any) -> Any:
    """Eval mode, no gradients; returns the model."""
    model.eval()
    model.requires_grad_(False)
    return model


def infer_model_name(source: Any) -> str | None:
    """A model's name: the source string itself, else the loaded model's config name_or_path, else None."""
    if source is None:
        return None
    if isinstance(source, str):
        return source
    return getattr(getattr(source, "config", None), "_name_or_path", None) or None


def resolve_model_sources(*, kind: str, model: Any | None, models: Sequence[Any] | None, expected_count: int,
                          expected_label: str | None = None, model_label: str = "model") -> tuple[list[Any], str | None]:
    """(one source per slot, the model name): `model` alone is broadcast; `models` must have expected_count
    entries; with both, every entry of `models` must be `model`."""
    label = expected_label or f"num_{kind}s"
    if model is None and not models:
        raise ValueError(f"Either {model_label} or {kind}s must be provided")
    if models is not None:
        items = list(models)
        if len(items) != expected_count:
            raise ValueError(f"{kind} length ({len(items)}) must match {label} ({expected_count}).")
        if model is not None and any(m != model for m in items):
            raise ValueError(f"conflict between {model_label} and {kind}s: {kind}s must list {expected_count} copies "
                             f"of {model_label}")
        return items, infer_model_name(model) if model is not None else None
    return [model] * expected_count, infer_model_name(model)
