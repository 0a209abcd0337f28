"""Per-environment training throughput: env_steps/s of a shipped config on this machine.

    python bench/env_throughput.py configs/magrpo-gsm8k.yaml configs/magrpo-bfcl.yaml ... [--items 4] [--threads 2]

Each config trains as shipped except for the number of training items (`--items`, default 4 = 2 updates at
rbs 2) in a fresh data dir (nothing cached), with `--threads` torch threads; prints env steps (joint actions
scored), training seconds (model loading and the final evaluation excluded) and their ratio. Run it on a quiet
machine: with another job busy, 2-thread torch runs here slow down many times.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--algorithm", default="magrpo")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    rows = []
    for config in args.configs:
        root = Path(tempfile.mkdtemp(prefix="coopflow-throughput-"))
        cfg = load_config(config, [f"taskset.num_items={args.items}", f"data_dir={root}"], algorithm=args.algorithm)
        s = run_inline(cfg)
        rows.append((Path(config).stem, s["env_steps"], s["train_seconds"], s["env_steps"] / s["train_seconds"]))
        print(f"{rows[-1][0]}: {rows[-1][1]} env steps in {rows[-1][2]:.0f} s = {rows[-1][3]:.3f} env_steps/s",
              flush=True)
    print(f"\n| config | env steps | train s | env_steps/s |  ({args.threads} torch threads, {args.items} items)")
    for name, steps, secs, rate in rows:
        print(f"| {name} | {steps} | {secs:.0f} | {rate:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
