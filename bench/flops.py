"""Matmul FLOPs of a training run's work, and this machine's dense matmul peak: the benches' efficiency figure.

What is counted (the same way for coopflow and the peer, from the tokens each side actually generated):

- a forward over one token at context length c costs 2 x (the decoder's projection weights + the LM head) FLOPs for
  the matmuls plus 4 x layers x (heads x head_dim) x c for attention (q.k and the weighted sum of v);
- generate: each distinct prompt of a generate call prefilled once (causal), then one forward per sampled token
  (EOS included, pads after it not) at its position;
- update: the policy loss forward + backward (3 x a forward) over each distinct prompt once and each completion's
  tokens on top of it.

That is the work the algorithm needs (model FLOPs, as in MFU): prompts prefilled K times, padded rows and
recomputed prompts are not credited, so a side that does redundant work shows a lower achieved rate. Element-wise
ops, norms and the sampling over the vocabulary are not counted (they are the overhead the figure exposes).

`matmul_peak(dtype, threads)`: the GFLOP/s of a dense 2048 x 2048 matmul on this machine, measured now (median of
repeats after a warm-up), so a run's achieved rate is read against the limit measured in the same run.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Llama-family decoder that set its matmul FLOPs."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @staticmethod
    def of(model_dir: str | Path) -> "Shape":
        c = json.loads((Path(model_dir) / "config.json").read_text())
        heads = c["num_attention_heads"]
        return Shape(c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], heads,
                     c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads,
                     c["vocab_size"])

    @property
    def matmul_params(self) -> int:
        """Weights multiplied per token: q, k, v, o, gate, up, down per layer, plus the LM head."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.hidden * self.vocab

    def forward(self, tokens: int, context_sum: int) -> float:
        """FLOPs of a forward over `tokens` tokens whose attention contexts sum to `context_sum`."""
        return 2.0 * self.matmul_params * tokens + 4.0 * self.layers * self.heads * self.head_dim * context_sum


def _tri(n: int) -> int:
    return n * (n + 1) // 2


@dataclass
class Work:
    """Matmul FLOPs of a run's generate and update phases (see the module docstring)."""

    generate: float = 0.0
    update: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0

    @property
    def total(self) -> float:
        return self.generate + self.update

    def add_call(self, shape: Shape, distinct_prompt_lengths: list[int], rows: list[tuple[int, int]]) -> None:
        """One generate call: the lengths of its distinct prompts, and per row (prompt length, sampled tokens)."""
        prefill = sum(shape.forward(p, _tri(p)) for p in distinct_prompt_lengths)
        # the t-th sampled token (t = 1..c) is produced by the forward at position p + t - 1 over p + t - 1 slots;
        # the first comes out of the prefill, so a row runs c - 1 decode forwards at contexts p + 1 .. p + c - 1
        decode = sum(shape.forward(c - 1, _tri(p + c - 1) - _tri(p)) for p, c in rows if c > 1)
        # the loss: prompts once, each completion token on top of its prompt, forward + backward = 3 forwards
        loss = prefill + sum(shape.forward(c, _tri(p + c) - _tri(p)) for p, c in rows)
        self.generate += prefill + decode
        self.update += 3.0 * loss
        self.calls += 1
        self.prompt_tokens += sum(distinct_prompt_lengths)
        self.sampled_tokens += sum(c for _, c in rows)

    @staticmethod
    def of_calls(shape: Shape, calls: list[dict]) -> "Work":
        """The work of recorded generate calls ({'distinct': [prompt lengths], 'rows': [[prompt length, sampled]]},
        as bench/peer_run.py prints them)."""
        work = Work()
        for c in calls:
            work.add_call(shape, c["distinct"], [tuple(x) for x in c["rows"]])
        return work

    def as_dict(self) -> dict:
        return {"generate_gflop": round(self.generate / 1e9, 2), "update_gflop": round(self.update / 1e9, 2),
                "total_gflop": round(self.total / 1e9, 2), "generate_calls": self.calls,
                "distinct_prompt_tokens": self.prompt_tokens, "sampled_tokens": self.sampled_tokens}


def coopflow_work(data_dir: str | Path, model_dir: str | Path) -> Work:
    """The work of a coopflow run, from the rollout tables in its artifact store (one generate call per step,
    turn and agent)."""
    import pyarrow.parquet as pq

    shape, work = Shape.of(model_dir), Work()
    calls: dict[tuple, list] = {}
    for f in sorted((Path(data_dir) / "artifacts" / "rollouts").glob("*/data.parquet")):
        t = pq.read_table(f, columns=["step", "turn", "agent", "prompt_ids", "length"]).to_pylist()
        for r in t:
            calls.setdefault((f.parent.name, r["step"], r["turn"], r["agent"]), []).append(r)
    for rows in calls.values():
        distinct = {tuple(r["prompt_ids"]) for r in rows}
        work.add_call(shape, [len(p) for p in distinct], [(len(r["prompt_ids"]), r["length"]) for r in rows])
    return work


def rates(work: Work, seconds: dict) -> dict:
    """Achieved GFLOP/s per phase and overall, from phase seconds {'generate', 'update', 'train'} (missing or zero
    phases are left out)."""
    out = {}
    for phase, flops in (("generate", work.generate), ("update", work.update), ("train", work.total)):
        s = seconds.get(phase)
        if s:
            out[f"{phase}_gflops"] = round(flops / s / 1e9, 1)
    return out


def record(work: Work, seconds: dict) -> dict:
    """{'work': ..., 'gflops': ...}: what a bench stores of a side's work and the rates it achieved."""
    return {"work": work.as_dict(), "gflops": rates(work, seconds)}


def matmul_peak(dtype: str = "float32", threads: int = 2, n: int = 2048, repeats: int = 5) -> float:
    """Dense n x n matmul GFLOP/s on this machine with `threads` torch threads (median of `repeats`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dt = getattr(torch, dtype)
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        a @ b  # warm-up (thread pool, kernel selection)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return 2.0 * n ** 3 / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(before)


def peaks(threads: int = 2) -> dict:
    """{'fp32': GFLOP/s, 'bf16': GFLOP/s} of this machine now."""
    return {"fp32": round(matmul_peak("float32", threads), 1), "bf16": round(matmul_peak("bfloat16", threads), 1)}
