"""The estimators researchers compare against, on the same workloads and seeds (issue 35).

    python bench/bench_estimators.py --workload multiturn [--seeds 0 1 2 3 4 5 6 7] [--methods ...]
    python bench/bench_estimators.py --workload tldr [--seeds 0 1 2] [--mode mp]

Methods (each is MAGRPO with only its own settings changed; nothing else is tuned per method):

- magrpo:         CoMLRL's MAGRPO (group-mean baseline, group z-normalization, one REINFORCE step per buffer);
- at-grpo:        AT-GRPO's greedy tree (tree_expansion: best; multi-turn only — one turn is MAGRPO itself);
- dr-mas:         per-agent normalization (advantage_normalization_scope: agent);
- reinforce++:    group-mean baseline, batch normalization (advantage_normalization_scope: batch);
- clipped-2 / -4: 2 / 4 optimizer passes per buffer, token ratio clipped at 0.2 (num_policy_epochs, clip_range).

Workloads: `multiturn` = configs/magrpo-multiturn.yaml (tiny model, 2 turns, length-ratio reward), `tldr` =
configs/magrpo-tldr.yaml on SmolLM2-135M-Instruct (bench_real's model copy; --mode sets mp / mp-bf16). Each
(method, seed) runs alone in a fresh child process after a quiet wait. Printed per method, mean ± standard error
over seeds: the final evaluation's reward (the config's eval items; multi-turn: the last turn's), the training
reward of the last fifth of updates, env_steps/s, training seconds, and the training seconds until the reward
first reaches `--threshold` (trailing mean of 4 updates' reward_mean; pro-rated by updates from the run's training
time, so a method whose updates cost more is charged for it) with how many seeds reached it.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import bench_magrpo as B  # noqa: E402  (quiet wait, child env, logging, mean_se)
import bench_real as R  # noqa: E402  (the shared SmolLM2 copy, mode settings, metered child runs)

METHODS = {
    "magrpo": {},
    "at-grpo": {"tree_expansion": "best"},
    "dr-mas": {"advantage_normalization_scope": "agent"},
    "reinforce++": {"advantage_normalization_scope": "batch"},
    "clipped-2": {"num_policy_epochs": 2, "clip_range": 0.2},
    "clipped-4": {"num_policy_epochs": 4, "clip_range": 0.2},
}
WORKLOADS = {  # config, eval reward key, default threshold (decided before any run)
    "multiturn": ("magrpo-multiturn.yaml", "eval/turn_2/reward_mean", 0.5),
    "tldr": ("magrpo-tldr.yaml", "eval/turn_1/reward_mean", -0.1),
}
WINDOW = 4

CHILD = r"""
import json, sys
from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.flows.driver import run_inline
from coopflow.stages.planning.context import make_context
from coopflow.stages.tasks.taskset import build_taskset
cfg = validate_config(json.load(open(sys.argv[1])))
s = run_inline(cfg)
store = ArtifactStore.of(cfg)
ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
try:
    steps = [r for k in ctx.plan.steps_keys for r in store.read_rows(store.find("steps", k))]
finally:
    ctx.session.close()
print("BENCH_RESULT " + json.dumps({"env_steps": s["env_steps"], "train_seconds": s["train_seconds"],
      "reward_first": s["reward_first"], "reward_last": s["reward_last"], "eval": s["eval"],
      "trajectory": [r["reward_mean"] for r in sorted(steps, key=lambda r: r["update"])]}))
"""


def run_config(workload: str, method: str, seed: int, data_dir: Path, mode: str) -> dict:
    from coopflow.schemas.config import load_config

    cfg = load_config(str(REPO / "configs" / WORKLOADS[workload][0]), [f"seed={seed}", f"data_dir={data_dir}"],
                      algorithm="magrpo")
    d = cfg.model_dump(mode="json", exclude_unset=True)
    d["algorithm"] = "magrpo"
    d.setdefault("tracking", {})["enabled"] = False
    d["trainer"].update(METHODS[method])
    if workload == "tldr":
        trainer_mode, dtype = R.mode_settings(mode)
        d["agents"]["agent_model"] = str(R.MODEL)
        d["agents"]["compute_dtype"] = dtype
        d["agents"]["torch_threads"] = 1 if mode.startswith("mp") else 2
        d["trainer"].update(trainer_mode)
    return d


def time_to(r: dict, threshold: float) -> float | None:
    """Training seconds until the trailing mean of WINDOW updates' reward first reaches the threshold (pro-rated)."""
    traj = r.get("trajectory") or []
    for u in range(len(traj)):
        win = traj[max(0, u - WINDOW + 1):u + 1]
        if len(win) == min(WINDOW, len(traj)) and sum(win) / len(win) >= threshold:
            return r["train_seconds"] * (u + 1) / len(traj)
    return None


def report(results: dict, workload: str, threshold: float) -> None:
    key = WORKLOADS[workload][1]
    print(f"\n{workload}: mean ± standard error over seeds; time to threshold = training seconds until the trailing "
          f"mean of {WINDOW} updates' reward reaches {threshold}")
    print(f"| method | seeds | eval {key} | train reward, last fifth | env_steps/s | training s | s to {threshold} "
          f"(seeds reaching it) |")
    print("|---|---|---|---|---|---|---|")
    for method, runs in results.items():
        ok = [r for r in runs.values() if r.get("train_seconds")]
        ev = [r["eval"][key] for r in ok if key in (r.get("eval") or {})]
        rate = [r["env_steps"] / r["train_seconds"] for r in ok]
        reach = [t for t in (time_to(r, threshold) for r in ok) if t is not None]
        print(f"| {method} | {len(ok)} | {B.mean_se(ev)} | {B.mean_se([r['reward_last'] for r in ok])} | "
              f"{B.mean_se(rate, '.2f')} | {B.mean_se([r['train_seconds'] for r in ok], '.1f')} | "
              f"{B.mean_se(reach, '.1f')} ({len(reach)}/{len(ok)}) |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="multiturn")
    ap.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    ap.add_argument("--seeds", type=int, nargs="+")
    ap.add_argument("--mode", default="mp", help="tldr: bench_real's mode (mp, mp-bf16, seq)")
    ap.add_argument("--threshold", type=float)
    ap.add_argument("--quiet-wait", type=float, default=30)
    ap.add_argument("--out")
    a = ap.parse_args()
    seeds = a.seeds or (list(range(8)) if a.workload == "multiturn" else [0, 1, 2])
    threshold = WORKLOADS[a.workload][2] if a.threshold is None else a.threshold
    methods = [m for m in a.methods if not (m == "at-grpo" and a.workload == "tldr")]  # one turn: AT-GRPO = MAGRPO
    if a.workload == "tldr":
        R.mode_settings(a.mode)
        R.ensure_model()
    out = Path(a.out or REPO / ".bench" / f"estimators-{a.workload}.json")
    tmp = Path(tempfile.mkdtemp(prefix="bench-estimators-"))
    results: dict = {}
    try:
        for seed in seeds:
            for method in methods:
                d = run_config(a.workload, method, seed, tmp / f"{method}-{seed}", a.mode)
                f = tmp / f"{method}-{seed}.json"
                f.write_text(json.dumps(d))
                B.wait_quiet(a.quiet_wait)
                B.log(f"{a.workload} seed {seed}: {method}")
                r = R.run_child([sys.executable, "-c", CHILD, str(f)], B.child_env(), 7200)
                if not r.get("train_seconds"):
                    B.log(f"  failed: {(r.get('stderr') or '')[-800:]}")
                results.setdefault(method, {})[seed] = r
                B.log(f"  {json.dumps({k: r.get(k) for k in ('train_seconds', 'reward_first', 'reward_last')})}")
                shutil.rmtree(tmp / f"{method}-{seed}", ignore_errors=True)
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps({"args": vars(a), "results": results}, indent=1, default=str))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(results, a.workload, threshold)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
