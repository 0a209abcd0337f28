"""Before/after study of a shipped environment config over several seeds (the README's measured runs).

For each seed: evaluate the initial policies on the eval items, train the config as shipped, evaluate the
final checkpoint with the same eval seed; then print every eval metric as mean ± sd over seeds with the
per-seed values, and the training reward's first and last fifth.

    python bench/study_envs.py configs/magrpo-tldr.yaml --seeds 0 1 2 [--set trainer.max_new_tokens=64]
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifacts import ArtifactStore  # noqa: E402
from schemas.config import load_config  # noqa: E402
from stages.common.seeds import derive_seed  # noqa: E402
from stages.evaluate.evaluate import evaluate  # noqa: E402
from stages.loops.context import formatters_for, make_context  # noqa: E402
from stages.loops.run import run_direct  # noqa: E402
from stages.loops.segment import acquire_policies  # noqa: E402
from stages.tasks.taskset import build_taskset  # noqa: E402


def one_seed(config: str, seed: int, root: Path, overrides: list[str], algorithm: str) -> dict:
    cfg = load_config(config, [*overrides, f"data_dir={root / str(seed)}", f"seed={seed}"], algorithm=algorithm)
    store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    t0 = time.time()
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    pol = acquire_policies(ctx, None, ctx.plan.start_key)
    caller, proc, _ = ctx.eval_reward()
    _, before = evaluate(pol, ctx.eval_items_used(), formatters_for(ctx, pol), ctx.sampling, caller, proc,
                         derive_seed(cfg.seed, "final-eval"), ctx.episode, ctx.eval_hooks,
                         samples=cfg.trainer.eval_samples_per_item)
    ctx.session.close()
    s = run_direct(cfg)
    return {"seed": seed, "before": before, "after": s["eval"], "reward_first": s["reward_first"],
            "reward_last": s["reward_last"], "env_steps": s["env_steps"], "train_seconds": s["train_seconds"],
            "wall_seconds": time.time() - t0}


def _fmt(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} ({', '.join(f'{v:.3g}' for v in values)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--data-root", help="one data dir per seed below this (default: a temp dir)")
    ap.add_argument("--algorithm", default="magrpo", help="the config's flow family (default magrpo)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = ap.parse_args(argv)
    root = Path(args.data_root or tempfile.mkdtemp(prefix="coopflow-study-"))
    rows = []
    for seed in args.seeds:
        rows.append(one_seed(args.config, seed, root, args.set, args.algorithm))
        print("RESULT", json.dumps(rows[-1]), flush=True)
    print(f"\n{args.config}, seeds {args.seeds}: metric | before | after")
    for k in rows[0]["before"]:
        if "expected_return" not in k:
            print(f"{k} | {_fmt([r['before'][k] for r in rows])} | {_fmt([r['after'][k] for r in rows])}")
    print(f"training reward first -> last fifth | {_fmt([r['reward_first'] for r in rows])} -> "
          f"{_fmt([r['reward_last'] for r in rows])}")
    print(f"train seconds per run | {_fmt([r['train_seconds'] for r in rows])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
