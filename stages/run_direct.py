"""Run a whole MAGRPO-family training by calling the stages directly (no Prefect, no MLflow).

Used by the benchmark as the "stages called directly" baseline that the Prefect flow's overhead is
measured against, and handy in notebooks. The flow in `flows/train.py` runs the same calls.
"""

import time

from artifacts import ArtifactStore
from schemas.config import RunConfig
from stages.build_taskset import build_taskset
from stages.train_online import (evaluate_checkpoint, first_last_fifth, make_context, segment_end_keys, train_seconds,
                                 train_segment)


def run_direct(cfg: RunConfig, store: ArtifactStore | None = None, show_progress: bool = False,
               metrics_refs: list | None = None) -> dict:
    """Train and evaluate; returns a summary dict (env_steps, reward_first/last, eval, checkpoint, ...).

    `train_seconds` is the training loop (generate, score, update, checkpoint) without model loading,
    which is reported as `load_seconds`; `wall_seconds` covers everything up to the final evaluation.
    """
    store = store or ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    t0 = time.perf_counter()
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store))
    ckpt, key, rewards, metrics = None, ctx.start_key, [], []
    ends = segment_end_keys(ctx)
    for i in range(len(ctx.segments)):
        res = train_segment(ctx, i, ckpt, key, show_progress=show_progress)
        ckpt, key = res.checkpoint, res.checkpoint.key
        assert key == ends[i]
        rewards += [r["reward_mean"] for r in store.read_rows(res.steps)]
        metrics.append(res.metrics)
    if metrics_refs is not None:  # the caller wants every segment's metrics table (e.g. to log them)
        metrics_refs.extend(metrics)
    wall_s = time.perf_counter() - t0
    train_s, load_s = train_seconds(store, metrics)
    _, ev = evaluate_checkpoint(ctx, ckpt)
    first, last = first_last_fifth(rewards)
    env = store.read_rows(res.steps)[-1]["env_step"]
    return {"env_steps": env, "reward_first": first, "reward_last": last, "train_seconds": train_s,
            "load_seconds": load_s, "wall_seconds": wall_s, "env_steps_per_s": env / train_s, "eval": ev,
            "checkpoint": str(store.open_dir(ckpt))}
