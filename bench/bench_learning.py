"""Learning per second: the shipped TL;DR config, coopflow vs CoMLRL 1.4.3, over seeds (issue 34).

    python bench/bench_learning.py [--config configs/magrpo-tldr.yaml] [--seeds 0 1 2] [--modes mp-bf16]
                                   [--peer-config mp-t1] [--quiet-wait 60] [--out .bench/learning.json]

Per seed, on the quiet 2-core machine, one side after the other (each in a fresh child process):

- coopflow trains the config as shipped (1 epoch over the 12 train posts, K=4, 160 tokens, rbs 2: 6 updates per
  agent, lr 1e-5) in each `--modes` mode (bench_real's modes: mp = a worker process per agent, -bf16 = bf16
  matmuls);
- the peer trains the same number of updates on the same prompts — coopflow's formatters render them (chat
  template and system prompts included) and the peer's formatters return that text — with the same sampling,
  learning rate and reward, in `--peer-config` (bench_magrpo's PEER_CONFIGS; mp-t1, its parallel mode with one
  torch thread per agent, was its fastest on this machine), then saves its agents;
- one evaluator scores every side: coopflow's evaluation of the start model, of coopflow's final checkpoint and of
  the peer's saved agents, with the same eval posts, samples, sampling settings and eval seed, in the weights' own
  dtype (float32, whatever the training mode computed in), so "before" and "after" are measured one way.

Both sides load the same model files (bench_real's copy of the catalog's SmolLM2-135M-Instruct with pad token
`<|endoftext|>`; with pad == eos as shipped, the peer generates empty strings). Wall time = training seconds
(models loaded before the clock on both sides; coopflow's include its checkpoint write). Printed: per side the
eval reward before/after as mean ± standard error over seeds (with the per-seed values), training seconds, and
the ratio of the peer's to coopflow's training seconds.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import bench_magrpo as B  # noqa: E402  (quiet wait, peer venv, child env, PEER_CONFIGS, mean_se)
import bench_real as R  # noqa: E402  (the shared model copy, mode settings, metered child runs)

MARK = "BENCH_RESULT "
REWARD_KEY = "eval/turn_1/reward_mean"

COOPFLOW_CHILD = r"""
import json, sys
from coopflow.schemas.config import validate_config
from coopflow.flows.driver import run_inline
s = run_inline(validate_config(json.load(open(sys.argv[1]))))
print("BENCH_RESULT " + json.dumps({"env_steps": s["env_steps"], "train_seconds": s["train_seconds"],
      "reward_first": s["reward_first"], "reward_last": s["reward_last"], "run_eval": s["eval"],
      "seconds": s["seconds"], "checkpoint": s["checkpoint"]}))
"""

EVAL_CHILD = r"""
import json, sys
from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.loops.run import evaluate_initial
from coopflow.stages.planning.context import make_context
from coopflow.stages.tasks.taskset import build_taskset
cfg = validate_config(json.load(open(sys.argv[1])))
store = ArtifactStore.of(cfg)
ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
try:
    print("BENCH_RESULT " + json.dumps({"after": evaluate_initial(ctx)[1]}))
finally:
    ctx.session.close()
"""


def base_config(path: str, seed: int, data_dir: Path, overrides: list[str]) -> dict:
    """The shipped config as a dict, on the shared model copy, with this seed and data dir."""
    from coopflow.schemas.config import load_config

    cfg = load_config(path, [*overrides, f"seed={seed}", f"data_dir={data_dir}"], algorithm="magrpo")
    d = cfg.model_dump(mode="json", exclude_unset=True)
    d["algorithm"] = "magrpo"
    d["agents"]["agent_model"] = str(R.MODEL)
    d.setdefault("tracking", {})["enabled"] = False
    return d


def rendered_items(cfg: dict) -> tuple[list[dict], dict]:
    """The train items as each agent's prompt text (coopflow's formatters) and the trainer settings the peer needs."""
    from transformers import AutoTokenizer

    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import validate_config
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.tasks.formatters import build_formatter
    from coopflow.stages.tasks.taskset import build_taskset

    rc = validate_config(cfg)
    store = ArtifactStore.of(rc)
    ctx = make_context(rc, store, build_taskset(rc.taskset, store))
    try:
        tok = AutoTokenizer.from_pretrained(R.MODEL)
        fmts = [build_formatter(rc.formatter_for(i), tok) for i in range(rc.agents.num_agents)]
        items = [{"prompts": [f(it) for f in fmts]} for it in ctx.train_items]
    finally:
        ctx.session.close()
    t = rc.trainer
    trainer = {k: getattr(t, k) for k in ("num_generations", "max_new_tokens", "temperature", "top_p", "top_k",
                                          "rollout_buffer_size", "agent_learning_rate", "num_train_epochs")}
    return items, trainer


def coopflow_run(cfg: dict, mode: str, tmp: Path, a) -> dict:
    trainer_mode, dtype = R.mode_settings(mode)
    run_cfg = json.loads(json.dumps(cfg))
    run_cfg["agents"]["compute_dtype"] = dtype
    run_cfg["agents"]["torch_threads"] = 1 if mode.startswith("mp") else 2
    run_cfg["trainer"].update(trainer_mode)
    f = tmp / f"cfg-{mode}-{cfg['seed']}.json"
    f.write_text(json.dumps(run_cfg))
    B.wait_quiet(a.quiet_wait)
    B.log(f"seed {cfg['seed']}: coopflow {mode}")
    r = R.run_child([sys.executable, "-c", COOPFLOW_CHILD, str(f)], B.child_env(), 7200)
    if r.get("checkpoint"):  # its own evaluation ran in the mode's compute dtype: score the weights as the peer's
        ck = Path(r["checkpoint"])
        r["after"] = evaluate_agents(cfg, [str(ck / f"agent_{i}") for i in range(cfg["agents"]["num_agents"])], tmp,
                                     f"{mode}-{cfg['seed']}")
    return r


def peer_run(cfg: dict, peer_py: Path, tmp: Path, a) -> dict:
    threads, mp = B.PEER_CONFIGS[a.peer_config]
    items, trainer = rendered_items(cfg)
    out = tmp / f"peer-{cfg['seed']}"
    spec = tmp / f"peer-{cfg['seed']}.json"
    spec.write_text(json.dumps({"model": str(R.MODEL), "seed": cfg["seed"], "threads": threads, "items": items,
                                "reward": cfg["reward"]["name"], "trainer": trainer}))
    B.wait_quiet(a.quiet_wait)
    B.log(f"seed {cfg['seed']}: peer ({a.peer_config})")
    env = {k: v for k, v in B.child_env().items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": str(threads)}
    r = R.run_child([str(peer_py), str(REPO / "bench" / "peer_run.py"), *(["--mp"] if mp else []),
                     str(REPO / "bench" / "peer_learn.py"), str(spec), str(out)], env, 7200)
    r.pop("peer_calls", None)
    if r.get("train_seconds"):  # coopflow's evaluator on the peer's saved agents
        r["after"] = evaluate_agents(cfg, [str(out / f"agent_{i}") for i in range(cfg["agents"]["num_agents"])],
                                     tmp, f"peer-{cfg['seed']}")
    shutil.rmtree(out, ignore_errors=True)
    return r


def evaluate_agents(cfg: dict, agent_dirs: list[str], tmp: Path, tag: str) -> dict | None:
    """coopflow's evaluator on these agent dirs: the config's eval posts, samples, sampling and eval seed, in the
    weights' own dtype (float32), so every side's policies are scored the same way."""
    ecfg = json.loads(json.dumps(cfg))
    ecfg["agents"].pop("agent_model", None)
    ecfg["agents"].pop("compute_dtype", None)
    ecfg["agents"]["agents"] = list(agent_dirs)
    ecfg["data_dir"] = str(tmp / f"eval-{tag}")
    f = tmp / f"eval-{tag}.json"
    f.write_text(json.dumps(ecfg))
    ev = R.run_child([sys.executable, "-c", EVAL_CHILD, str(f)], B.child_env(), 7200)
    shutil.rmtree(tmp / f"eval-{tag}", ignore_errors=True)
    if ev.get("after") is None:
        B.log(f"evaluation of {tag} failed: {(ev.get('stderr') or '')[-800:]}")
    return ev.get("after")


def report(results: dict, seeds: list[int]) -> None:
    start = [r["after"][REWARD_KEY] for r in results.get("start", {}).values() if r.get("after")]
    print(f"\n{REWARD_KEY} on the eval posts (coopflow's evaluator, float32, the run's eval seed), mean ± standard "
          f"error over seeds {seeds}")
    print(f"  {'start model':14s}: {B.mean_se(start)}  ({', '.join(f'{x:.3f}' for x in start)})")
    secs = {}
    for side, runs in results.items():
        if side == "start":
            continue
        after = [r["after"][REWARD_KEY] for r in runs.values() if r.get("after")]
        train = [r["train_seconds"] for r in runs.values() if r.get("train_seconds")]
        secs[side] = statistics.mean(train) if train else None
        print(f"  {side:14s}: after {B.mean_se(after)}  ({', '.join(f'{x:.3f}' for x in after)})  training seconds "
              f"{B.mean_se(train)}  training reward first→last fifth "
              + ", ".join(f"{r.get('reward_first', 0):.2f}→{r.get('reward_last', 0):.2f}" for r in runs.values()
                          if r.get("train_seconds")))
    if secs.get("peer"):
        for side, s in secs.items():
            if side != "peer" and s:
                print(f"  peer / coopflow {side} training seconds: {secs['peer'] / s:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "magrpo-tldr.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="*", default=["mp-bf16"], help="coopflow modes (bench_real's)")
    ap.add_argument("--peer-config", default="mp-t1", choices=sorted(B.PEER_CONFIGS))
    ap.add_argument("--set", nargs="*", default=[], help="config overrides (KEY=VALUE), e.g. for a quick check")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--quiet-wait", type=float, default=60)
    ap.add_argument("--out", default=str(REPO / ".bench" / "learning.json"))
    a = ap.parse_args()
    for m in a.modes:
        R.mode_settings(m)  # unknown modes fail here, before anything runs
    R.ensure_model()
    peer_py = None if a.skip_peer else B.ensure_peer_venv()
    tmp = Path(tempfile.mkdtemp(prefix="bench-learning-"))
    results: dict = {}
    try:
        for seed in a.seeds:
            cfg = base_config(a.config, seed, tmp / f"data-{seed}", a.set)
            B.wait_quiet(a.quiet_wait)
            results.setdefault("start", {})[seed] = {"after": evaluate_agents(
                cfg, [str(R.MODEL)] * cfg["agents"]["num_agents"], tmp, f"start-{seed}")}
            for mode in a.modes:
                cfg_m = dict(cfg, data_dir=str(tmp / f"data-{mode}-{seed}"))
                results.setdefault(mode, {})[seed] = r = coopflow_run(cfg_m, mode, tmp, a)
                B.log(f"  {json.dumps(r)[:400]}")
                shutil.rmtree(tmp / f"data-{mode}-{seed}", ignore_errors=True)
            if peer_py is not None:
                results.setdefault("peer", {})[seed] = r = peer_run(dict(cfg, data_dir=str(tmp / f"data-peer-{seed}")),
                                                                   peer_py, tmp, a)
                B.log(f"  {json.dumps(r)[:400]}")
            Path(a.out).parent.mkdir(exist_ok=True)
            Path(a.out).write_text(json.dumps({"args": vars(a), "results": results}, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, a.seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
