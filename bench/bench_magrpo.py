"""Benchmark: coopflow's MAGRPO vs the CoMLRL 1.4.3 peer, plus the Prefect flow's overhead.

Usage (from the repo root, with the coopflow venv's python):

    python bench/bench_magrpo.py [--workloads a b] [--modes seq mp] [--skip-peer] [--skip-flow] [--quiet-wait 240]
                                 [--flow-repeats 1] [--out .bench/results.json]
    (--workloads with no names: only the flow-overhead measurement)

What one run does:
1. ensures the peer venv (bench/setup_peer.sh, idempotent) and the two model dirs under .bench/models
   (built by ../shared/bench/make_tiny_model.py; SHARED_DIR overrides the shared bench dir). The
   SAME model dirs are loaded by both sides.
2. per workload: waits for a quiet machine, runs the peer harness (comlrl_peer.py) in the peer venv,
   waits again, runs coopflow's run driver with the inline runner (flows.driver.run_inline, what trainer.train()
   runs; untracked) in a child process of this
   python with a fresh data dir. Both children are metered from here (wall, CPU, and how many cores
   *other* processes kept busy meanwhile: 'others_busy_cores', 0 = clean, ~2 = heavy contention).
3. flow overhead (workload b, coopflow only): one child with a fresh COOPFLOW_HOME runs a warm-up flow
   (ephemeral Prefect server start, imports, MLflow DB creation excluded), then times
   flows.train.train_magrpo(config=...) and flows.driver.run_inline(cfg) on the same fresh work
   (same config and seed; new taskset file and data dir, so nothing is cached; --flow-repeats pairs,
   median reported). Besides wall differences (noisy: the training loop alone varies ±10 % run to run), it
   reports the *accounted* overhead: per run, the wall time outside the stage functions both paths call
   (flow: Prefect, MLflow, glue; direct: glue), flow minus direct, as a share of the flow's wall.
4. prints a table and writes every raw result to --out.

Metric definitions are coopflow's: env_steps = joint actions scored (peer: len(rewards_seen));
env_steps_per_s = env_steps / train seconds; reward_first/last = mean of the first/last fifth of the
reward stream. The peer's train seconds cover `trainer.train()` (models loaded before its clock);
coopflow's `train_seconds` cover the update loop and checkpoint writes, with model loading (and the
mp worker start-up) reported apart as `load_seconds`. The 'cf loop' column (generate + score +
update only) also excludes checkpoint writes. coopflow runs in two modes (--modes): seq (agents in one
process) and mp (parallel_training=mp: one persistent worker process per agent, 1 torch thread each).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import flops  # noqa: E402  (bench/flops.py: FLOPs of the work done, the machine's matmul peak)

_SHARED = Path(os.environ.get("SHARED_DIR", REPO.parent / "shared")).expanduser().resolve()
# SHARED_DIR is the shared dir holding bench/; a path to the bench dir itself is accepted too.
SHARED_BENCH = _SHARED if (_SHARED / "comlrl_peer.py").is_file() else _SHARED / "bench"
MODELS = REPO / ".bench" / "models"
MODEL_SPECS = {"tiny": (64, 2), "small": (256, 4)}  # hidden size, layers
THREADS = 2
MARK = "BENCH_RESULT "

# Workloads exactly as the issues state them; mt/mts: multi-turn (2 turns, K=4, aligned, early termination
# off, the peer's comlrl_peer_multiturn.py transition = coopflow's `plain` with the same instruction).
WORKLOADS = {
    "a": dict(model="tiny", K=4, tokens=32, rbs=1, items=16, epochs=2),
    "b": dict(model="small", K=8, tokens=64, rbs=2, items=8, epochs=1),
    "mt": dict(model="tiny", K=4, tokens=32, rbs=2, items=8, epochs=1, turns=2),
    "mts": dict(model="small", K=4, tokens=32, rbs=2, items=8, epochs=1, turns=2),
    # actor-critic on the small model as the peer measurements run it (comlrl_peer_ac.py: K=1, 64 tok, rbs 4
    # samples per agent, 16 items x 1, separate critics for IAC = the same small model, top_k None).
    "iac": dict(model="small", K=1, tokens=64, rbs=4, items=16, epochs=1, algo="iac"),
    "maac": dict(model="small", K=1, tokens=64, rbs=4, items=16, epochs=1, algo="maac"),
}
MT_INSTRUCTION = "Revise: agent 2 must write 2-3 times more than agent 1."


# --- shared helpers (parent and children) --------------------------------------------------------


MODES = {"seq": {}, "mp": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]},
         "mp_masked": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"], "loss_on_padding": False},
         "seq-bf16": {"compute_dtype": "auto"},
         "mp-bf16": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"], "compute_dtype": "auto"}}
"""coopflow variants: agents in the main process, or one persistent worker process per agent (mp_masked: that with
the masked loss, trainer.loss_on_padding=false, instead of the reference's exact loss; -bf16: with
agents.compute_dtype=auto, bf16 matmuls where the CPU has them)."""


def shared_common():
    """comlrl_peer_common from the shared bench dir (story_prompts, wait_quiet, Meter, _proc_stat)."""
    if str(SHARED_BENCH) not in sys.path:
        sys.path.insert(0, str(SHARED_BENCH))
    import comlrl_peer_common  # noqa: E402

    return comlrl_peer_common


def write_taskset(path: Path, n: int) -> Path:
    """The peer's prompts (story_prompts(n)) as a JSONL taskset coopflow reads with taskset.name=<file>."""
    prompts = shared_common().story_prompts(n)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def coopflow_config(w: dict, taskset: Path, data_dir: Path | None, seed: int = 0, **trainer_over) -> dict:
    """The RunConfig dict of a workload (same hyper-parameters as the peer harness)."""
    trainer = dict(num_train_epochs=w["epochs"], agent_learning_rate=1e-3, num_agents=2,
                   num_generations=w["K"], max_new_tokens=w["tokens"], temperature=1.0, top_p=1.0, top_k=50,
                   num_turns=w.get("turns", 1), rollout_buffer_size=w["rbs"], logging_steps=1, eval_interval=0)
    if w.get("turns", 1) > 1:
        trainer.update(early_termination_threshold=None, joint_mode="aligned")
    agents = {"agent_model": str(MODELS / w["model"]), "num_agents": 2}
    if "compute_dtype" in trainer_over:  # an agents setting, carried by the mode like the trainer ones
        trainer_over = dict(trainer_over)
        agents["compute_dtype"] = trainer_over.pop("compute_dtype")
    trainer.update(trainer_over)
    cfg = {"algorithm": "magrpo",
           "agents": agents,
           "taskset": {"name": str(taskset), "num_items": w["items"]},
           "reward": {"name": "length_ratio"},
           "trainer": trainer,
           "seed": seed}
    if w.get("turns", 1) > 1:
        cfg["transition"] = {"name": "plain", "kwargs": {"instruction": MT_INSTRUCTION}}
    if w.get("algo") in ("iac", "maac"):
        cfg["algorithm"] = w["algo"]
        cfg["critic"] = {"critic_model": str(MODELS / w["model"])}
        t = cfg["trainer"]
        for k in ("logging_steps",):
            t.pop(k, None)
        t.update(top_k=None, critic_learning_rate=1e-3)
        if t.get("parallel_training") == "mp":
            t["critic_devices"] = ["cpu"] * (2 if w["algo"] == "iac" else 1)
    if data_dir is not None:
        cfg["data_dir"] = str(data_dir)
    return cfg


def parse_json_line(text: str, marker: str | None = None) -> dict | None:
    """Last stdout line that is a JSON object (after `marker` when given)."""
    for line in reversed(text.splitlines()):
        if marker is not None:
            if not line.startswith(marker):
                continue
            line = line[len(marker):]
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


# --- children (run in separate processes of the coopflow venv) -----------------------------------


def _loop_timing(data_dir: Path) -> dict:
    """Sum coopflow's per-segment timing/* metrics found in a run's artifact store."""
    import pyarrow.parquet as pq

    tot: dict[str, float] = {}
    for f in sorted((data_dir / "artifacts" / "metrics").glob("*/data.parquet")):
        for r in pq.read_table(f).to_pylist():
            k = r["key"]
            if k.startswith("timing/") and k.endswith("_s") and not k.endswith("_per_s"):
                tot[k[7:]] = tot.get(k[7:], 0.0) + r["value"]
    return {k: round(v, 4) for k, v in tot.items()}


def _add_loop_rate(summary: dict, data_dir: Path) -> dict:
    t = _loop_timing(data_dir)
    loop = sum(t.get(k, 0.0) for k in ("generate_s", "score_s", "update_s"))
    summary["timing"] = t
    summary["loop_seconds"] = round(loop, 4)
    summary["loop_env_steps_per_s"] = summary["env_steps"] / loop if loop > 0 else None
    return summary


def child_direct(spec: dict) -> None:
    """Workload run: flows.driver.run_inline on a fresh data dir; prints MARK + summary JSON."""
    import torch

    torch.set_num_threads(THREADS)
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    cfg = load_config(base=spec["config"])
    # Warm the process before the clock starts, as the peer harness is warm when its clock starts (it
    # imports and loads the models before t0): the first from_pretrained of a process imports ~1000
    # modules (torch.distributed, torch._dynamo, sympy, ...; ~2 s here) that the run would otherwise
    # count in its train_seconds. The run still loads its own models inside its clock.
    t0 = time.perf_counter()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(spec["config"]["agents"]["agent_model"])
    AutoModelForCausalLM.from_pretrained(spec["config"]["agents"]["agent_model"], dtype=torch.float32)
    warm_s = time.perf_counter() - t0

    Meter = shared_common().Meter
    with Meter() as m:
        summary = run_inline(cfg)
    summary["inproc_meter"] = m.summary()
    summary["process_warmup_s"] = round(warm_s, 3)
    summary["torch_threads"] = torch.get_num_threads()
    _add_loop_rate(summary, Path(spec["config"]["data_dir"]))
    _add_work(summary, Path(spec["config"]["data_dir"]), spec["config"]["agents"]["agent_model"])
    print(MARK + json.dumps(summary, default=str), flush=True)


def _add_work(summary: dict, data_dir: Path, model_dir: str) -> dict:
    """The run's matmul work (bench/flops.py) and the GFLOP/s it achieved per phase and over its train seconds."""
    t = summary.get("timing") or {}
    summary.update(flops.record(flops.coopflow_work(data_dir, model_dir), {
        "generate": t.get("generate_s"), "update": t.get("update_s"), "train": summary.get("train_seconds")}))
    return summary


class TreeMeter:
    """Meter for a phase of the flow child: wall, own CPU, CPU of its subprocesses (Prefect's ephemeral
    server runs as one), and cores kept busy by processes outside this process tree."""

    def _tree_cpu(self) -> tuple[float, float]:
        import psutil

        me = psutil.Process()
        own = sum(me.cpu_times()[:2])
        kids = 0.0
        for c in me.children(recursive=True):
            try:
                kids += sum(c.cpu_times()[:2])
            except psutil.Error:
                pass
        return own, kids

    def __enter__(self):
        self.t0, self.b0, (self.o0, self.k0) = time.perf_counter(), shared_common()._proc_stat(), self._tree_cpu()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        busy = (shared_common()._proc_stat() - self.b0) / os.sysconf("SC_CLK_TCK")
        own, kids = self._tree_cpu()
        self.cpu, self.kids_cpu = own - self.o0, max(0.0, kids - self.k0)
        self.others_busy_cores = max(0.0, (busy - self.cpu - self.kids_cpu) / max(self.wall, 1e-9))
        return False

    def summary(self) -> dict:
        return {"wall_s": round(self.wall, 3), "cpu_s": round(self.cpu, 2),
                "subprocess_cpu_s": round(self.kids_cpu, 2), "others_busy_cores": round(self.others_busy_cores, 2)}


class StageClock:
    """Wall time spent inside the stage functions both paths call (outermost calls only), so a run's time
    *outside* them — Prefect, MLflow and the glue around the stages — is measured within that one run,
    free of the run-to-run noise of the training loop that a flow-vs-direct difference carries."""

    def __init__(self):
        self.seconds, self._depth = 0.0, 0

    def wrap(self, fn):
        def timed(*a, **k):
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t
        return timed

    def install(self) -> None:
        """Wrap the stages where the run driver (flows/driver.py) looks them up (the pre-flight, which both paths
        run inside the driver, counts as a stage)."""
        import coopflow.flows.driver as FT
        import coopflow.stages.loops.run as LR
        import coopflow.stages.operations.preflight as PF
        import coopflow.stages.planning.context as LC

        for mod, names in ((LR, ("evaluate_initial", "evaluate_checkpoint", "training_summary")),
                           (LC, ("resolve_sources", "make_context")), (FT, ("build_taskset", "train_segment")),
                           (PF, ("preflight",))):
            for name in names:
                setattr(mod, name, self.wrap(getattr(mod, name)))

    def take(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


def child_flow(spec: dict) -> None:
    """Flow overhead: warm-up flow, then per pair a timed flow run and a timed direct run of the same fresh work."""
    os.environ["COOPFLOW_HOME"] = spec["home"]
    from coopflow.flows.env import configure

    configure()  # before prefect is imported
    import torch

    torch.set_num_threads(THREADS)
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from coopflow.flows.train import train_magrpo
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    out: dict = {"torch_threads": torch.get_num_threads(), "pairs": []}
    clock = StageClock()
    clock.install()
    # As flows/cli.py: no heartbeat thread for a foreground run.
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        with TreeMeter() as m:
            warm = train_magrpo(config=spec["warmup"])
        out["warmup"] = {"wall_s": m.wall, "meter": m.summary(), "env_steps": warm.get("env_steps")}
        for i, pair in enumerate(spec["pairs"]):
            rec: dict = {"order": "flow-first" if i % 2 == 0 else "direct-first"}
            # Alternate which side runs first, so drift within a pair (caches, CPU clocks) cancels out.
            for side in (("flow", "direct") if i % 2 == 0 else ("direct", "flow")):
                if side == "flow":
                    clock.take()
                    with TreeMeter() as m:
                        flow = train_magrpo(config=pair["flow"])
                    rec["flow"] = {"wall_s": m.wall, "meter": m.summary(), "summary": flow, "stages_s": clock.take()}
                else:
                    cfg = load_config(base=pair["direct"])
                    clock.take()
                    with TreeMeter() as m:
                        direct = run_inline(cfg)
                    rec["direct"] = {"wall_s": m.wall, "meter": m.summary(), "stages_s": clock.take(),
                                     "summary": _add_loop_rate(direct, Path(pair["direct"]["data_dir"]))}
            out["pairs"].append(rec)
    print(MARK + json.dumps(out, default=str), flush=True)


# --- parent --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_metered(cmd: list[str], env: dict, cwd: Path, timeout: float) -> dict:
    """Run a child, capture its output, and meter it from outside (wall, child CPU, others' busy cores).

    The child's CPU is its whole process tree's: what the kernel reports for reaped descendants, or, where more,
    the sum of every descendant's own CPU time sampled 4 times a second (mp workers are children of the child's
    forkserver, which is never reaped by it: without sampling their CPU would count as other processes' load)."""
    import threading

    import psutil

    pc = shared_common()
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict[int, float] = {}  # descendant pid -> its own CPU seconds at the last sample
    done = threading.Event()

    def sample():
        me = psutil.Process()
        while not done.is_set():
            for q in me.children(recursive=True):
                try:
                    t = q.cpu_times()
                    seen[q.pid] = max(seen.get(q.pid, 0.0), t.user + t.system)
                except psutil.Error:
                    pass
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    c0, b0, l0, t0 = os.times(), pc._proc_stat(), os.getloadavg()[0], time.perf_counter()
    sampler.start()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - t0
    b1, c1 = pc._proc_stat(), os.times()
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    cpu = max(cpu, sum(seen.values()))
    others = max(0.0, ((b1 - b0) / hz - cpu) / wall)
    return {"rc": rc, "stdout": out, "stderr": err,
            "meter": {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "others_busy_cores": round(others, 2),
                      "loadavg1_start_end": [round(l0, 2), round(os.getloadavg()[0], 2)]}}


def ensure_peer_venv() -> Path:
    log("ensuring the peer venv (bench/setup_peer.sh)")
    p = subprocess.run(["bash", str(REPO / "bench" / "setup_peer.sh")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench/setup_peer.sh failed (rc={p.returncode})")
    return Path(p.stdout.strip().splitlines()[-1])


def ensure_models(builder_python: Path) -> None:
    maker = SHARED_BENCH / "make_tiny_model.py"
    for name, (hidden, layers) in MODEL_SPECS.items():
        d = MODELS / name
        if (d / "config.json").is_file() and (d / "tokenizer.json").is_file():
            continue
        if not maker.is_file():
            raise SystemExit(f"{maker} not found (set SHARED_DIR to the dir holding bench/make_tiny_model.py)")
        log(f"building model {name} (hidden {hidden}, {layers} layers) in {d}")
        d.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(builder_python), str(maker), str(d), str(hidden), str(layers)], check=True,
                       cwd=SHARED_BENCH)


def wait_quiet(seconds: float) -> dict:
    if seconds <= 0:
        return {"waited_s": 0.0, "busy_cores": None}
    waited, busy = shared_common().wait_quiet(max_wait=seconds)
    log(f"quiet wait: {waited:.0f} s, others busy {busy} cores")
    return {"waited_s": waited, "busy_cores": busy}


def mean_se(xs: list[float], fmt: str = ".3f") -> str:
    """'mean ± standard error' of values over seeds ('-' for none)."""
    if not xs:
        return "-"
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):{fmt}} ± {se:{fmt}}"


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("WANDB_MODE", "disabled")
    env["SHARED_DIR"] = str(SHARED_BENCH)
    return env


def run_child(mode: str, spec: dict, tmp: Path, timeout: float) -> dict:
    spec_file = tmp / f"spec-{mode}-{time.time_ns()}.json"
    spec_file.write_text(json.dumps(spec))
    r = run_metered([sys.executable, str(Path(__file__).resolve()), "--child", mode, "--spec", str(spec_file)],
                    child_env(), REPO, timeout)
    r["result"] = parse_json_line(r["stdout"], MARK)
    return r


PEER_CONFIGS = {"t1": (1, False), "t2": (2, False), "mp-t1": (1, True), "mp-t2": (2, True)}
"""The peer's configurations on this machine: torch threads per process, and whether its own parallel mode runs
the two agents at once (`parallel_training="mp"` on per-agent CPU device names, a thread per agent; see
bench/peer_run.py). Each repeat runs the chosen ones and compares coopflow with the fastest."""


def run_peer(peer_py: Path, w: dict, timeout: float, seed: int = 0, config: str = "t2") -> dict:
    threads, mp = PEER_CONFIGS[config]
    env = dict(os.environ, K=str(w["K"]), TOKENS=str(w["tokens"]), RBS=str(w["rbs"]), THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    harness = "comlrl_peer.py"
    extra: list[str] = []
    if w.get("algo") in ("iac", "maac"):
        harness = "comlrl_peer_ac.py"
        extra = [w["algo"]]
        env.update(SEPARATE="1", CRITIC_TYPE="v")
    if w.get("turns", 1) > 1:
        harness = "comlrl_peer_multiturn.py"
        env.update(TURNS=str(w["turns"]), JOINT="aligned", ET="none")
    args = extra + [str(MODELS / w["model"]), str(w["items"]), str(w["epochs"])]
    opts = (["--mp"] if mp else []) + (["--seed", str(seed)] if seed else [])
    cmd = [str(peer_py), str(REPO / "bench" / "peer_run.py"), *opts, harness, *args]
    r = run_metered(cmd, env, SHARED_BENCH, timeout)
    res = parse_json_line(r["stdout"])
    if res is not None:
        if "sec_per_step" in res:
            dt = res["sec_per_step"] * res["steps"]
            res["env_steps"] = round(res["env_steps_per_s"] * dt)  # = len(rewards_seen)
        else:  # the multi-turn and AC harnesses report env_steps and env_steps/s over trainer.train()'s wall
            dt = res["env_steps"] / res["env_steps_per_s"]
        res["train_seconds"] = dt
        res["config"] = config
        calls = (parse_json_line(r["stdout"], "PEER_WORK ") or {}).get("calls")
        if calls:
            res.update(flops.record(flops.Work.of_calls(flops.Shape.of(MODELS / w["model"]), calls), {"train": dt}))
    r["result"] = res
    return r


def _best_peer_config(rec: dict, configs: list[str]) -> str:
    """The peer configuration with the highest median rate in a workload's speed repeats (the first if none ran)."""
    rates = {pc: [x for x in rec["repeats"].get(f"peer:{pc}", []) if x is not None] for pc in configs}
    ran = {pc: statistics.median(v) for pc, v in rates.items() if v}
    return max(ran, key=ran.get) if ran else configs[0]


def _tail(r: dict, n: int = 1500) -> str:
    return (r.get("stderr") or "")[-n:]


def _strip(r: dict) -> dict:
    """A run record for the JSON output: keep output tails, not the whole log."""
    d = {k: v for k, v in r.items() if k not in ("stdout", "stderr")}
    if r.get("rc") != 0 or r.get("result") is None:
        d["stderr_tail"] = _tail(r, 4000)
        d["stdout_tail"] = (r.get("stdout") or "")[-2000:]
    return d


def f(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


NOISY = 0.5  # others_busy_cores above this: the timing is not a clean measurement


def busy(v) -> str:
    return "-" if v is None else f"{v:.2f}" + ("!" if v > NOISY else "")


def _reward_record(res: dict, seed: int) -> dict:
    return {"seed": seed, "reward_first": res.get("reward_first"), "reward_last": res.get("reward_last"),
            "env_steps_per_s": res.get("env_steps_per_s"),
            "eval": (res.get("eval") or {}).get("eval/turn_1/reward_mean")}


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def print_repeats(results: dict) -> None:
    """Median env_steps/s per side and the median per-repeat ratio, for workloads measured more than once."""
    for name, r in results["workloads"].items():
        reps = r.get("repeats") or {}
        peer = reps.get("peer") or []
        for mode, all_rates in reps.items():
            rates = [c for c in all_rates if c is not None]  # failed repeats are None
            if mode.startswith("peer:") and rates:
                print(f"{name} peer {mode[5:]}: {len(rates)} repeat(s), median {statistics.median(rates):.2f} "
                      f"env_steps/s ({', '.join(f(x) for x in all_rates)})")
            if mode.startswith("peer") or len(rates) < 2:
                continue
            ratios = [c / p for c, p in zip(all_rates, peer) if c is not None and p is not None]
            line = f"{name} coopflow {mode}: {len(rates)} repeats, median {statistics.median(rates):.2f} env_steps/s"
            if ratios:
                ok_peer = [p for p in peer if p is not None]
                line += (f", fastest peer per repeat median {statistics.median(ok_peer):.2f}, ratio median "
                         f"{statistics.median(ratios):.2f}x (per repeat {min(ratios):.2f}-{max(ratios):.2f}x)")
            print(line)


def print_seed_table(results: dict) -> None:
    rows = [("workload", "side", "seeds", "reward first", "reward last", "env_steps/s", "eval reward")]
    for name, r in results["workloads"].items():
        for side, recs in (r.get("seeds") or {}).items():
            if recs:
                rows.append((name, "peer" if side == "peer" else f"coopflow {side}", str(len(recs)),
                             f(_mean([x["reward_first"] for x in recs])), f(_mean([x["reward_last"] for x in recs])),
                             f(_mean([x["env_steps_per_s"] for x in recs])), f(_mean([x["eval"] for x in recs]))))
    if len(rows) == 1:
        return
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    print("\nmeans over seeds 0..N-1 (peer: its harness with torch.manual_seed redirected to the seed):")
    for i, row in enumerate(rows):
        print("  ".join(str(c).ljust(widths[j]) for j, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def print_table(results: dict) -> None:
    rows = [("workload", "cf mode", "peer", "peer st/s", "cf st/s", "cf/peer", "cf loop st/s", "peer rew f→l",
             "cf rew f→l", "cf eval", "GFLOP/s peer", "GFLOP/s cf gen/upd/all", "busy peer", "busy cf")]
    for name, r in results["workloads"].items():
        p = (r.get("peer") or {}).get("result") or {}
        w = r["spec"]
        label = f"{name}: {w['model']} K={w['K']} {w['tokens']}tok rbs{w['rbs']} {w['items']}x{w['epochs']}"
        if w.get("turns", 1) > 1:
            label += f" {w['turns']} turns"
        if w.get("algo"):
            label = f"{name}: {w['model']} K={w['K']} {w['tokens']}tok rbs{w['rbs']} {w['items']}x{w['epochs']}"
        for tag in ["coopflow" if m == "seq" else f"coopflow_{m}" for m in MODES if ("coopflow" if m == "seq" else
                                                                             f"coopflow_{m}") in r]:
            c = (r.get(tag) or {}).get("result") or {}
            ps, cs = p.get("env_steps_per_s"), c.get("env_steps_per_s")
            g = c.get("gflops") or {}
            rows.append((label, "seq" if tag == "coopflow" else tag.removeprefix("coopflow_"), p.get("config", "-"),
                         f(ps), f(cs),
                         f(cs / ps if ps and cs else None) + ("x" if ps and cs else ""),
                         f(c.get("loop_env_steps_per_s")),
                         f"{f(p.get('reward_first'))}→{f(p.get('reward_last'))}",
                         f"{f(c.get('reward_first'))}→{f(c.get('reward_last'))}",
                         f((c.get("eval") or {}).get("eval/turn_1/reward_mean")),
                         f((p.get("gflops") or {}).get("train_gflops"), ".1f"),
                         "/".join(f(g.get(k), ".1f") for k in ("generate_gflops", "update_gflops", "train_gflops")),
                         busy((r.get("peer") or {}).get("meter", {}).get("others_busy_cores")),
                         busy((r.get(tag) or {}).get("meter", {}).get("others_busy_cores"))))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    print()
    for i, row in enumerate(rows if len(rows) > 1 else []):
        print("  ".join(str(c).ljust(widths[j]) if j == 0 else str(c).rjust(widths[j]) for j, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    if len(rows) > 1:
        print("st/s = env_steps/s (joint actions scored per train second; both sides exclude model loading); "
              "cf = coopflow run_inline (train_seconds = update loop + checkpoint writes; 'cf loop' = "
              "generate+score+update only); cf mode: seq = agents in one process, mp = a worker process per agent; "
              "peer = the fastest peer configuration of the repeat (tN: N torch threads, mp-tN: its parallel mode); "
              "GFLOP/s = matmul FLOPs of the work done (bench/flops.py) per second: peer over its train seconds, cf "
              "per phase (generate, update) and over its train seconds; "
              "busy = cores other processes kept busy during the child (0 clean .. 2 saturated; '!' = noisy, > "
              f"{NOISY})")
    pk = results.get("matmul_peak_gflops")
    if pk:
        print(f"this machine's dense matmul peak, measured in this run ({THREADS} threads, 2048x2048): "
              f"fp32 {pk['fp32']} GFLOP/s, bf16 {pk['bf16']} GFLOP/s")
    fo = results.get("flow_overhead")
    if fo:
        if fo.get("pairs"):
            n = len(fo["pairs"])
            print(f"\nflow overhead (workload b, one process, after a {fo['warmup_s']:.1f} s warm-up flow"
                  + (f", medians of {n} pairs" if n > 1 else "") + f"): flow {fo['flow_s']:.2f} s, direct "
                  f"{fo['direct_s']:.2f} s -> overhead (flow-direct)/flow = {fo['overhead_pct']:.1f} %"
                  + (" (median of the pairs' overheads)" if n > 1 else "")
                  + f"; fixed overhead (wall minus the training loop, flow vs direct) = {fo['fixed_overhead_pct']:.1f} %"
                  + (f"; pooled (sum of flow walls vs sum of direct walls) = {fo['pooled_overhead_pct']:.1f} %"
                     if n > 1 else ""))
            if "accounted_overhead_pct" in fo:
                print(f"accounted (each run's time outside the stages, within the run): flow {fo['outside_flow_s']:.3f} s, "
                      f"direct {fo['outside_direct_s']:.3f} s -> overhead {fo['accounted_overhead_pct']:.1f} % of the flow's "
                      "wall" + (" (medians)" if n > 1 else ""))
            for p in fo["pairs"]:
                noisy = max(p["others_busy_flow"], p["others_busy_direct"]) > NOISY
                print(f"  [{p['order']}] flow {p['flow_s']:.2f} s (train {f(p['flow_train_s'])} s, CPU {p['flow_cpu_s']:.1f} s + "
                      f"{p['flow_subprocess_cpu_s']:.1f} s Prefect server)  direct {p['direct_s']:.2f} s (train "
                      f"{f(p['direct_train_s'])} s, CPU {p['direct_cpu_s']:.1f} s)  overhead {p['overhead_pct']:.1f} % "
                      f"(fixed {p['fixed_overhead_pct']:.1f} %, accounted {p.get('accounted_overhead_pct', float('nan')):.1f} %)  "
                      f"others busy {p['others_busy_flow']:.2f}/{p['others_busy_direct']:.2f}" + ("  NOISY" if noisy else ""))
        else:
            print(f"\nflow overhead: FAILED ({fo.get('error')})")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="*", default=["a", "b"], choices=sorted(WORKLOADS),
                    help="workloads to compare (none: only the flow-overhead measurement)")
    ap.add_argument("--skip-peer", action="store_true", help="run coopflow only (no peer venv needed if models exist)")
    ap.add_argument("--skip-flow", action="store_true", help="skip the flow-overhead measurement")
    ap.add_argument("--seeds", type=int, default=1,
                    help="also run both sides with seeds 0..N-1 and print mean rewards (reward_last after a few "
                         "updates is very seed dependent)")
    ap.add_argument("--modes", nargs="+", default=["seq", "mp"], choices=sorted(MODES),
                    help="coopflow variants: seq (agents in one process), mp (one worker process per agent)")
    ap.add_argument("--peer-configs", nargs="+", default=["t1", "t2", "mp-t1"], choices=sorted(PEER_CONFIGS),
                    help="peer configurations run in each repeat (tN: N torch threads; mp-tN: the peer's parallel "
                         "mode, a thread per agent, N torch threads each); coopflow is compared with the fastest")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure each workload's speed N times, peer and modes interleaved; prints median rates and "
                         "the median of the per-repeat ratios (the machine's speed drifts by 10-30 %% between runs)")
    ap.add_argument("--flow-repeats", type=int, default=1,
                    help="timed (flow, direct) pairs after the warm-up flow; the overhead reported is the median")
    ap.add_argument("--quiet-wait", type=float, default=240,
                    help="max seconds to wait for a quiet machine before each timed child (0 = no wait)")
    ap.add_argument("--timeout", type=float, default=1800, help="per-child timeout in seconds")
    ap.add_argument("--out", default=str(REPO / ".bench" / "results.json"))
    ap.add_argument("--child", choices=["direct", "flow"], help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        spec = json.loads(Path(args.spec).read_text())
        (child_direct if args.child == "direct" else child_flow)(spec)
        return 0

    peer_py = None
    if not args.skip_peer:
        peer_py = ensure_peer_venv()
    ensure_models(peer_py or Path(sys.executable))
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": THREADS, "quiet_wait": args.quiet_wait,
                     "nproc": os.cpu_count(), "models": {k: str(MODELS / k) for k in MODEL_SPECS},
                     "peer_python": str(peer_py) if peer_py else None, "workloads": {}}
    failures = 0
    if args.workloads:
        wait_quiet(args.quiet_wait)
        results["matmul_peak_gflops"] = flops.peaks(THREADS)
        log(f"dense matmul peak: {results['matmul_peak_gflops']} GFLOP/s")
    with tempfile.TemporaryDirectory(prefix="coopflow-bench-") as tmp_s:
        tmp = Path(tmp_s)
        for name in args.workloads:
            w = WORKLOADS[name]
            rec: dict = {"spec": w, "repeats": {"peer": [], **{m: [] for m in args.modes}}}
            results["workloads"][name] = rec
            taskset = write_taskset(tmp / f"prompts-{name}.jsonl", w["items"])
            for rep in range(args.repeats):
                # Repeats interleave the sides (peer, then each mode) so that a drift of the machine's speed
                # hits all of them alike; the first repeat's full records are kept, every rate in 'repeats'.
                first = rep == 0
                if peer_py:
                    # every peer configuration; coopflow is compared with the fastest of this repeat
                    best = None
                    for pc in args.peer_configs:
                        quiet = wait_quiet(args.quiet_wait)
                        log(f"workload {name}: peer (CoMLRL 1.4.3, {pc})" + (f", repeat {rep + 1}" if rep else ""))
                        r = run_peer(peer_py, w, args.timeout, config=pc)
                        rate = (r["result"] or {}).get("env_steps_per_s")  # None: failed
                        rec["repeats"].setdefault(f"peer:{pc}", []).append(rate)
                        if r["result"] is None:
                            failures += 1
                            log(f"peer ({pc}) failed rc={r['rc']}:\n{_tail(r)}")
                            continue
                        log(f"peer ({pc}): {rate:.2f} env_steps/s, others busy {r['meter']['others_busy_cores']}")
                        if best is None or rate > best[0]["result"]["env_steps_per_s"]:
                            best = (r, quiet)
                    if first and best is not None:
                        rec["peer"], rec["peer_quiet"] = _strip(best[0]), best[1]
                    rec["repeats"]["peer"].append(best[0]["result"]["env_steps_per_s"] if best else None)
                for mode in args.modes:
                    over = MODES[mode]
                    cfg = coopflow_config(w, taskset, tmp / f"data-{name}-{mode}-{rep}", **over)
                    tag = "coopflow" if mode == "seq" else f"coopflow_{mode}"
                    quiet = wait_quiet(args.quiet_wait)
                    if first:
                        rec[f"{tag}_config"] = cfg
                        rec[f"{tag}_quiet"] = quiet
                    log(f"workload {name}: coopflow run_inline ({mode})" + (f", repeat {rep + 1}" if rep else ""))
                    r = run_child("direct", {"config": cfg}, tmp, args.timeout)
                    if first:
                        rec[tag] = _strip(r)
                    rec["repeats"][mode].append((r["result"] or {}).get("env_steps_per_s"))  # None: failed
                    if r["result"] is None:
                        failures += 1
                        log(f"coopflow ({mode}) failed rc={r['rc']}:\n{_tail(r)}")
                    else:
                        log(f"coopflow ({mode}): {r['result']['env_steps_per_s']:.2f} env_steps/s, others busy "
                            f"{r['meter']['others_busy_cores']}")

        if args.seeds > 1:
            # Rewards after a few updates depend a lot on the sampling seed: compare means over seeds.
            for name in args.workloads:
                w, rec = WORKLOADS[name], results["workloads"][name]
                taskset = write_taskset(tmp / f"prompts-{name}-seeds.jsonl", w["items"])
                per: dict = {"peer": [], **{m: [] for m in args.modes}}
                for seed in range(args.seeds):
                    if peer_py:
                        pc = _best_peer_config(rec, args.peer_configs)
                        log(f"workload {name}: peer ({pc}), seed {seed}")
                        r = run_peer(peer_py, w, args.timeout, seed, pc)
                        if r["result"]:
                            per["peer"].append(_reward_record(r["result"], seed))
                    for mode in args.modes:
                        cfg = coopflow_config(w, taskset, tmp / f"seed-{name}-{mode}-{seed}", seed=seed, **MODES[mode])
                        log(f"workload {name}: coopflow ({mode}), seed {seed}")
                        r = run_child("direct", {"config": cfg}, tmp, args.timeout)
                        if r["result"]:
                            per[mode].append(_reward_record(r["result"], seed))
                rec["seeds"] = per

        if not args.skip_flow:
            w = WORKLOADS["b"]
            home = tmp / "flow-home"
            warm_ts = write_taskset(tmp / "prompts-flow-warmup.jsonl", w["items"])
            pairs = []
            for i in range(args.flow_repeats):
                # A new taskset file (new taskset key) and seed per pair: nothing the flow runs is cached.
                ts = write_taskset(tmp / f"prompts-flow-timed-{i}.jsonl", w["items"])
                pairs.append({"flow": coopflow_config(w, ts, None, seed=7 + i),
                              "direct": coopflow_config(w, ts, tmp / f"flow-direct-data-{i}", seed=7 + i)})
            spec = {"home": str(home), "warmup": coopflow_config(w, warm_ts, None, seed=1001, max_new_tokens=4),
                    "pairs": pairs}
            fo: dict = {"spec": spec, "quiet": wait_quiet(args.quiet_wait)}
            log(f"flow overhead: warm-up flow, then {args.flow_repeats}x (timed flow, timed run_inline) "
                "on workload b in one process")
            r = run_child("flow", spec, tmp, args.timeout)
            fo["run"] = _strip(r)
            res = r["result"]
            if res is None:
                failures += 1
                fo["error"] = f"rc={r['rc']}"
                log(f"flow-overhead child failed rc={r['rc']}:\n{_tail(r)}")
            else:
                fo["warmup_s"] = res["warmup"]["wall_s"]
                fo["pairs"] = []
                for p in res["pairs"]:
                    fl, di = p["flow"], p["direct"]
                    fo["pairs"].append(dict(
                        order=p.get("order"), flow_s=fl["wall_s"], direct_s=di["wall_s"],
                        overhead_pct=100.0 * (fl["wall_s"] - di["wall_s"]) / fl["wall_s"],
                        # The training loop is the same code in both; its run-to-run noise (±10 % here) is not
                        # overhead. Fixed overhead = what the flow adds around the loop.
                        fixed_overhead_pct=100.0 * ((fl["wall_s"] - (fl["summary"].get("train_seconds") or 0))
                                                    - (di["wall_s"] - (di["summary"].get("train_seconds") or 0)))
                        / fl["wall_s"],
                        # Accounted: each run's time outside the stages, flow minus direct (within-run, low noise).
                        outside_flow_s=fl["wall_s"] - fl["stages_s"], outside_direct_s=di["wall_s"] - di["stages_s"],
                        accounted_overhead_pct=100.0 * ((fl["wall_s"] - fl["stages_s"]) - (di["wall_s"] - di["stages_s"]))
                        / fl["wall_s"],
                        flow_cpu_s=fl["meter"]["cpu_s"], flow_subprocess_cpu_s=fl["meter"]["subprocess_cpu_s"],
                        direct_cpu_s=di["meter"]["cpu_s"],
                        others_busy_flow=fl["meter"]["others_busy_cores"],
                        others_busy_direct=di["meter"]["others_busy_cores"],
                        flow_env_steps=fl["summary"].get("env_steps"), direct_env_steps=di["summary"].get("env_steps"),
                        flow_train_s=fl["summary"].get("train_seconds"), direct_train_s=di["summary"].get("train_seconds"),
                        flow_reward_first_last=[fl["summary"].get("reward_first"), fl["summary"].get("reward_last")],
                        direct_reward_first_last=[di["summary"].get("reward_first"), di["summary"].get("reward_last")]))
                med = lambda k: statistics.median(p[k] for p in fo["pairs"])  # noqa: E731
                fo.update(flow_s=med("flow_s"), direct_s=med("direct_s"), overhead_pct=med("overhead_pct"),
                          fixed_overhead_pct=med("fixed_overhead_pct"), outside_flow_s=med("outside_flow_s"),
                          outside_direct_s=med("outside_direct_s"), accounted_overhead_pct=med("accounted_overhead_pct"))
                # Pooled: total flow time vs total direct time over all pairs (less noisy than a median of ratios).
                tf, td = sum(p["flow_s"] for p in fo["pairs"]), sum(p["direct_s"] for p in fo["pairs"])
                fo["pooled_overhead_pct"] = 100.0 * (tf - td) / tf
            results["flow_overhead"] = fo

    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print_table(results)
    print_repeats(results)
    print_seed_table(results)
    print(f"raw results: {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
