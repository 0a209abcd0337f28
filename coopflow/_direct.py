"""`trainer.train()` without Prefect: the stages called in this process, tracked in MLflow."""

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import RunConfig

ITERATIVE = ("madpo-iter", "marlhf-iter")
PREFERENCE = ("madpo", "marlhf")


def run_tracked(cfg: RunConfig, tags: list[str] | dict | None = None, show_progress: bool = True,
                session=None) -> dict:
    """Train with the algorithm's stages; one MLflow run (params, metrics by env_step, eval); returns a summary."""
    from coopflow.flows.train import _public
    from coopflow.flows.tracking import tracker_for

    store = ArtifactStore(cfg.resolved_data_dir() / "artifacts")
    tr = cfg.tracking
    tracker = tracker_for(cfg)
    run_tags = {"coopflow.algorithm": cfg.algorithm, "coopflow.entry": "python-api"}
    if isinstance(tags, dict):
        run_tags.update({str(k): str(v) for k, v in tags.items()})
    elif tags:
        run_tags.update({f"tag.{t}": "true" for t in tags})
    run_id = tracker.start(tr.run_name or f"{cfg.algorithm}-python-api", run_tags, _public(cfg))
    ok = False
    try:
        out = _run(cfg, store, show_progress, session)
        for ref in out.pop("_metrics_refs", []):
            tracker.log_metrics(store.read_rows(ref), flush=False)
        step = out.get("env_steps") or 0
        tracker.log_metrics([{"key": k, "value": v, "env_step": step} for k, v in (out.get("eval") or {}).items()])
        if cfg.algorithm not in ITERATIVE + PREFERENCE:  # lets a longer run of this config continue this one
            from pathlib import Path

            from coopflow.stages.agents.checkpoint import policy_key_of

            tracker.tag({"coopflow.run_key": policy_key_of(Path(out["checkpoint"]).name)})
        out["mlflow_run_id"] = run_id
        ok = True
        return out
    finally:
        tracker.finish(ok)


def _run(cfg: RunConfig, store: ArtifactStore, show_progress: bool, session=None) -> dict:
    """The algorithm's stages in this process; `session` may carry live agents to start from (trained in place)."""
    if cfg.algorithm in ITERATIVE:
        from coopflow.stages.loops import rounds as I
        from coopflow.stages.loops.context import make_context
        from coopflow.stages.tasks.taskset import build_taskset

        from coopflow.stages.agents.checkpoint import CheckpointLayout

        ctx = make_context(cfg, store, build_taskset(cfg.taskset, store), session=session)
        try:
            rounds = I.run_rounds(ctx, show_progress=show_progress)
        finally:
            ctx.session.close()
        last = rounds[-1]
        ev = I.round_eval(store, last["metrics"])
        ckpt = store.open_dir(last["checkpoint"])
        return {"algorithm": cfg.algorithm, "completed_rounds": len(rounds), "checkpoint": str(ckpt), "eval": ev,
                "env_steps": CheckpointLayout(ckpt).trainer_state().get("env_step", 0),
                "executed": ctx.session.executed(), "_metrics_refs": [r["metrics"] for r in rounds]}
    if cfg.algorithm in PREFERENCE:
        from coopflow.stages.loops.preference import run_preference_direct

        out = run_preference_direct(cfg, store, session)
        out.pop("metrics", None)
        return {"algorithm": cfg.algorithm, **out}
    from coopflow.stages.loops.run import run_direct

    refs: list = []
    out = run_direct(cfg, store, show_progress, metrics_refs=refs, session=session)
    return {"algorithm": cfg.algorithm, **out, "_metrics_refs": refs}
