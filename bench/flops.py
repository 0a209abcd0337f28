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

Floors (`Limits`, `phase_floors`): the least time each phase of a run could take on this machine, from limits
measured in the same run — one core's matmul peak and memory read bandwidth while every core works, and the disk's
durable (fsync'd) write bandwidth:

- generate, per call on the agent's core: the prefill's FLOPs at the peak, then per decode step the larger of
  reading the matmul weights once (decoding is a pass over every weight per token) and the step's FLOPs at the peak
  (rows still sampling only);
- update: the loss forward + backward FLOPs at the peak (AdamW's pass over the weights and moments not counted);
- checkpoint: the bytes it wrote at the durable write bandwidth (the best of one, two and four files at once).

A floor is a lower bound, not a prediction: it assumes every matmul at the dense peak and every weight read at the
streaming bandwidth. Agents that run side by side (mp: a process and a core each) take the slowest agent's floor;
agents that take turns take the sum.
"""

from __future__ import annotations

import json
import os
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


def _prefill(shape: "Shape", distinct_prompt_lengths: list[int]) -> float:
    """FLOPs of prefilling each distinct prompt once (causal)."""
    return sum(shape.forward(p, _tri(p)) for p in distinct_prompt_lengths)


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
        prefill = _prefill(shape, distinct_prompt_lengths)
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


def coopflow_calls(data_dir: str | Path) -> list[dict]:
    """The generate calls of a coopflow run, from the rollout tables in its artifact store (one call per step, turn
    and agent): {'agent': index, 'distinct': [prompt lengths], 'rows': [(prompt length, sampled tokens)]}."""
    import pyarrow.parquet as pq

    calls: dict[tuple, list] = {}
    for f in sorted((Path(data_dir) / "artifacts" / "rollouts").glob("*/data.parquet")):
        t = pq.read_table(f, columns=["step", "turn", "agent", "prompt_ids", "length"]).to_pylist()
        for r in t:
            calls.setdefault((f.parent.name, r["step"], r["turn"], r["agent"]), []).append(r)
    return [{"agent": key[3], "distinct": [len(p) for p in {tuple(r["prompt_ids"]) for r in rows}],
             "rows": [(len(r["prompt_ids"]), r["length"]) for r in rows]} for key, rows in calls.items()]


def coopflow_work(data_dir: str | Path, model_dir: str | Path) -> Work:
    """The work of a coopflow run, from the rollout tables in its artifact store."""
    shape, work = Shape.of(model_dir), Work()
    for c in coopflow_calls(data_dir):
        work.add_call(shape, c["distinct"], c["rows"])
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


# --- floors: the least time each phase could take on this machine -------------------------------------------------


def read_bandwidth(nbytes: int = 1 << 29, threads: int = 1, repeats: int = 5) -> dict:
    """Memory bandwidth in GB/s over `nbytes`-sized buffers (larger than any cache level that matters), all
    `threads` torch threads reading: 'read' = the best of a float32 dot (two streams; one thread) and sum (one
    stream), the fastest pure read reached; 'copy' = bytes read by a copy (as many written besides)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = nbytes // 4
        x, y = torch.randn(n), torch.randn(n)

        def best(fn):
            fn()
            return min(timed(fn) for _ in range(repeats))

        total = nbytes / best(lambda: x.sum())
        dot = 2 * nbytes / best(lambda: torch.dot(x, y)) if threads == 1 else 0.0
        copy = nbytes / best(lambda: y.copy_(x))
        return {"read": max(dot, total) / 1e9, "copy": copy / 1e9}
    finally:
        torch.set_num_threads(before)


def disk_write_bandwidth(directory: str | Path, nbytes: int = 1 << 30, block: int = 16 << 20,
                         streams: tuple[int, ...] = (1, 2, 4)) -> float:
    """GB/s of durable writes in `directory`, the best over `streams`: `nbytes` in all, split among that many files
    written side by side in `block`-sized pieces, each then fsync'd (what a checkpoint waits for before its key is
    recorded; virtual disks take several streams at once faster than one). The files are removed."""
    import threading

    buf = os.urandom(block)
    best = 0.0
    for n in streams:
        paths = [Path(directory) / f".disk-bandwidth-{os.getpid()}-{i}" for i in range(n)]
        pieces = max(1, nbytes // block // n)

        def write(path: Path) -> None:
            with open(path, "wb") as f:
                for _ in range(pieces):
                    f.write(buf)
                f.flush()
                os.fsync(f.fileno())

        threads = [threading.Thread(target=write, args=(p,)) for p in paths]
        t0 = time.perf_counter()
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            best = max(best, n * pieces * block / (time.perf_counter() - t0) / 1e9)
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
    return best


def timed(fn) -> float:
    """Seconds one call of fn() takes."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@dataclass(frozen=True)
class Limits:
    """This machine's limits for one agent's work, measured in the run they are compared with."""

    peak: float  # GFLOP/s of one core's dense matmuls in the run's compute dtype, every core busy
    read: float  # GB/s one core reads while every core reads
    weight_bytes: int  # bytes per weight the decode loop reads each step: 2 (bf16 matmuls) or 4 (float32)
    disk: float  # GB/s of durable (fsync'd) writes


def call_floor(shape: Shape, distinct_prompt_lengths: list[int], rows: list[tuple[int, int]],
               lim: Limits) -> tuple[float, float]:
    """(generate, update) seconds one generate call and its loss pass take at least on one core (module docstring)."""
    w = Work()
    w.add_call(shape, distinct_prompt_lengths, rows)
    prefill = _prefill(shape, distinct_prompt_lengths)
    read = shape.matmul_params * lim.weight_bytes / (lim.read * 1e9)
    gen = prefill / (lim.peak * 1e9)
    for s in range(1, max((c for _, c in rows), default=0)):  # decode step s yields token s + 1 of the rows left
        live = [p for p, c in rows if c > s]
        gen += max(read, shape.forward(len(live), sum(p + s for p in live)) / (lim.peak * 1e9))
    return gen, w.update / (lim.peak * 1e9)


def phase_floors(shape: Shape, calls: list[dict], lim: Limits, side_by_side: bool, cores: int = 1,
                 checkpoint_bytes: int = 0) -> dict:
    """Floor seconds per phase of a run from its generate calls (`coopflow_calls`): {'generate', 'update',
    'checkpoint', 'train' (their sum)}. `side_by_side`: the agents run at once, a core each (mp), so a phase takes
    its slowest agent's floor; else they take turns on `cores` cores, and the agents' floors add up (divided by
    `cores`)."""
    per_agent: dict = {}
    for c in calls:
        g, u = call_floor(shape, c["distinct"], [tuple(r) for r in c["rows"]], lim)
        acc = per_agent.setdefault(c.get("agent", 0), [0.0, 0.0])
        acc[0] += g
        acc[1] += u

    def combine(xs):
        return max(xs, default=0.0) if side_by_side else sum(xs) / cores

    out = {"generate": combine([a[0] for a in per_agent.values()]),
           "update": combine([a[1] for a in per_agent.values()]),
           "checkpoint": checkpoint_bytes / (lim.disk * 1e9)}
    out["train"] = sum(out.values())
    return {k: round(v, 3) for k, v in out.items()}
