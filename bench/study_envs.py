"""Before/after study of a shipped environment config over several seeds (the README's measured runs).

For each seed: train the config as shipped; the run evaluates the initial policies and the final checkpoint on the
same eval items with the same eval seed (`eval_before`); then print every eval metric as mean ± sd over seeds with the
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

from coopflow.schemas.config import load_config  # noqa: E402
from coopflow.flows.driver import run_inline  # noqa: E402


def one_seed(config: str, seed: int, root: Path, overrides: list[str], algorithm: str) -> dict:
    cfg = load_config(config, [*overrides, f"data_dir={root / str(seed)}", f"seed={seed}", "eval_before=true"],
                      algorithm=algorithm)
    t0 = time.time()
    s = run_inline(cfg)
    return {"seed": seed, "before": s["eval_before"], "after": s["eval"], "reward_first": s["reward_first"],
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
