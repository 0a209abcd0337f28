"""What logging the joint answers to MLflow costs: a tracked run with `tracking.rollouts` none / the default / all.

    python bench/bench_tracking.py [--config configs/magrpo-story.yaml] [--repeats 3] [--threads 2]

Each run is the config through the run driver (`flows.driver.run_inline`, MLflow on SQLite in a fresh data dir),
with a fresh `cache_salt` so every stage computes; the three settings are interleaved per repeat so drift of the
machine hits them alike. Prints each run's wall time, the mean per setting and the overhead against `none` (target:
<= 3 % at the default). Measure on a quiet machine.
"""

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ("none", 10, "all")


def one(base: dict, setting, salt: str, threads: int) -> float:
    from coopflow.flows.driver import run_inline
    from coopflow.schemas.config import validate_config

    data = {**base, "data_dir": tempfile.mkdtemp(prefix="bench-tracking-"), "cache_salt": salt,
            "tracking": {**base.get("tracking", {}), "enabled": True, "rollouts": setting},
            "agents": {**base.get("agents", {}), "torch_threads": threads}}
    cfg = validate_config(data)
    gc.collect()  # every run starts from a settled heap: a full collection of the many runs' leftovers inside
    gc.freeze()   # one run lands on whichever setting happens to run then (seen: +1.2 s on 2 of 15 runs)
    t0 = time.perf_counter()
    run_inline(cfg, tracking=True)  # (the driver waits for MLflow's queued writes before it returns)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/magrpo-story.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    for s in SETTINGS:  # builds the tiny model; imports what each setting's MLflow writes use (once per process)
        one(base, s, f"warmup-{s}", args.threads)
    times: dict = {s: [] for s in SETTINGS}
    for r in range(args.repeats):
        for s in SETTINGS:
            t = one(base, s, f"r{r}-{s}", args.threads)
            times[s].append(t)
            print(f"repeat {r + 1}  tracking.rollouts={s!s:<5} {t:7.2f} s", flush=True)
    ref, ref_med = statistics.mean(times["none"]), statistics.median(times["none"])
    print(f"\n{args.config}, {args.repeats} repeats, {args.threads} torch threads")
    for s in SETTINGS:
        m, med = statistics.mean(times[s]), statistics.median(times[s])
        se = statistics.stdev(times[s]) / len(times[s]) ** 0.5 if len(times[s]) > 1 else 0.0
        print(f"tracking.rollouts={s!s:<5} mean {m:6.2f} s ± {se:.2f} (s.e.), median {med:6.2f} s;  vs none: "
              f"mean {100 * (m / ref - 1):+5.1f} %, median {100 * (med / ref_med - 1):+5.1f} %")


if __name__ == "__main__":
    main()
