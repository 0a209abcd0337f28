"""Attention in the loss passes under a bf16 / fp16 autocast: in float32 where that is the faster kernel.

An agent whose loss passes autocast to bf16 (`agents.compute_dtype`) hands bf16 queries, keys and values to
PyTorch's SDPA, which then runs its bf16 attention kernel, forward and backward. On a CPU without AMX that kernel
is slower than the float32 one on the same inputs (the decode loop keeps its KV cache and attention in float32
there for the same reason, `hardware.fast_bf16_attention`), most of all for small heads. On such devices the agent's
models run attention through `WIDE_SDPA`: the same SDPA call on the queries, keys and values cast up to float32,
its output cast to the autocast dtype (queries and keys reach attention in float32 anyway, after the rotary
embedding, and SDPA's autocast rule casts them down). The matmuls around it stay bf16; the masks, scaling and
dropout are SDPA's own; the flash kernel keeps its inputs and a log-sum-exp for the backward, not the attention
matrix, so the extra memory is the float32 copies of q, k and v. Outside an autocast (a float32 loss, evaluation,
`generate`) the inputs are already float32 and `WIDE_SDPA` is plain SDPA.

Grouped-query attention (fewer key/value heads than query heads) under a mask: transformers copies each key/value
head once per query head it serves before calling SDPA (`repeat_kv`), and its backward sums the copies' gradients
back. On a CPU, SDPA's flash kernel takes the grouping itself (`enable_gqa`, masked or not), so `WIDE_SDPA` calls it
that way there: the same attention without the copies (the outputs the same numbers, the key/value gradients
summed in another order; measured: `bench/bench_levers.py --levers loss_wide_gqa`, the benchmarks page).

`use_wide_attention(model, compute_dtype)` switches a model to it or back (a per-agent op of the run's compute
setting, `state.set_compute_dtype`); only models on SDPA are switched, so a user's `attn_implementation` stays.
"""

import functools

import torch

from coopflow.stages.agents.hardware import fast_bf16_attention

WIDE_SDPA = "coopflow_sdpa_float32"
"""The attention implementation name the wide SDPA is registered under in transformers."""

_NARROW = {"bfloat16", "float16"}


def _sdpa_float32(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on float32 q, k, v with autocast off inside (which would cast them back down);
    the output in the autocast dtype, as SDPA's would be. Without an autocast: plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    device = query.device.type
    if not torch.is_autocast_enabled(device):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    with torch.autocast(device, enabled=False):
        if _grouped_on_cpu(module, query, attention_mask, kwargs):
            out = torch.nn.functional.scaled_dot_product_attention(
                query.float(), key.float(), value.float(), attn_mask=attention_mask,
                dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"), enable_gqa=True)
            out, weights = out.transpose(1, 2).contiguous(), None
        else:
            out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                                  **kwargs)
    return out.to(torch.get_autocast_dtype(device)), weights


def _grouped_on_cpu(module, query, attention_mask, kwargs) -> bool:
    """Whether this call is masked grouped-query attention on a CPU with nothing but SDPA's own options: the case
    transformers answers with key/value copies (`repeat_kv`) and SDPA's CPU kernel takes grouped. A causal call
    without a mask, a position bias, a softcap or a request for the weights keep transformers' path."""
    return (query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1
            and getattr(module, "num_key_value_groups", 1) > 1
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and not kwargs.get("output_attentions", False))


@functools.cache
def register() -> str:
    """Register `WIDE_SDPA` (the attention and SDPA's mask format) with transformers, once per process."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(WIDE_SDPA, _sdpa_float32)
    AttentionMaskInterface.register(WIDE_SDPA, sdpa_mask)
    return WIDE_SDPA


def wide_attention(model, compute_dtype: str | None) -> bool:
    """Whether `model`'s loss passes should run attention in float32: they autocast float32 weights to a bf16 / fp16
    `compute_dtype` on a device whose bf16 attention is the slower kernel (a CPU without AMX)."""
    if compute_dtype not in _NARROW:
        return False
    param = next(model.parameters(), None)
    return param is not None and param.dtype == torch.float32 and not fast_bf16_attention(param.device)


def use_wide_attention(model, compute_dtype: str | None) -> None:
    """Switch a model on SDPA to `WIDE_SDPA` where `wide_attention` says so, and back to SDPA where it does not; any
    other attention implementation is left as it is."""
    if model is None:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # (PEFT wraps the model)
    current = getattr(base.config, "_attn_implementation", None)
    if current not in ("sdpa", WIDE_SDPA):
        return
    wanted = register() if wide_attention(base, compute_dtype) else "sdpa"
    if wanted != current:
        base.set_attn_implementation(wanted)
