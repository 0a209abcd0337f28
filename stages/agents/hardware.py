"""What this process's devices do fast, read once: native bf16 matmuls, and whether bf16 attention beats float32.

The attention answer decides numerics of a bf16 run (the decode loop's KV cache, the loss passes' attention), so the
planning puts it in a bf16 run's keys (native bf16 enters them through the resolved compute dtype). Kept apart from
the decode loop so that the modules that ask do not import the decoder (and its code into their keys).
"""

import functools

import torch


def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` has native bf16 matmuls (CPU: AVX512-BF16 or AMX in /proc/cpuinfo; CUDA: Ampere+)."""
    if str(device).startswith("cuda") or device == "auto" and torch.cuda.is_available():
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    flags = _cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@functools.cache
def _cpu_flags() -> str:
    """/proc/cpuinfo, read once per process ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def fast_bf16_attention(dev: torch.device) -> bool:
    """Whether bf16 attention beats float32 here: on a GPU, and on CPUs with AMX (measured 1.14x per decode step
    there; on AVX512-BF16 CPUs without AMX bf16 SDPA was the slower kernel, in the decode loop and the loss passes)."""
    return dev.type == "cuda" or "amx_bf16" in _cpu_flags()
