"""`trainer.train()`: the one run driver (`coopflow.flows.driver`, the same as `coopflow run` and the
deployments) with the inline runner: every step called in this process, no Prefect server. The run takes
the run-key lock, continues a killed run's MLflow run, publishes to the remote mirror and records lineage
exactly as a flow run does; it is tagged `coopflow.entry=python-api` (plus the trainer's `wandb_config` tags)
and named `<algorithm>-python-api` unless the config names it.

`_run` is not an entry point: the stages called directly, untracked and unlocked (the fault tests'
kill-and-rerun children and the disk tests use it to make a store's artifacts)."""

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import RunConfig

ENTRY_TAG = {"coopflow.entry": "python-api"}


def run_tracked(cfg: RunConfig, tags: list[str] | dict | None = None, show_progress: bool = True,
                session=None, continue_run: str | None = None) -> dict:
    """Run the config's algorithm through the driver in this process; returns the run summary. `tags`: a dict of
    MLflow tags or a list of names (tagged `tag.<name>=true`); `session`: live agents to start from."""
    from coopflow.flows import driver

    run_tags = dict(ENTRY_TAG)
    if isinstance(tags, dict):
        run_tags.update({str(k): str(v) for k, v in tags.items()})
    elif tags:
        run_tags.update({f"tag.{t}": "true" for t in tags})
    runner = driver.inline_runner(run_tags, label="python-api", session=session)
    return driver.run(cfg, runner, show_progress=show_progress, continue_run=continue_run)


def _run(cfg: RunConfig, store: ArtifactStore, show_progress: bool, session=None) -> dict:
    """The algorithm's stages called directly in this process (no MLflow, no lock); `session` may carry live
    agents to start from."""
    if cfg.algorithm in ("madpo-iter", "marlhf-iter"):
        from coopflow.stages.agents.checkpoint import CheckpointLayout
        from coopflow.stages.loops import rounds as I
        from coopflow.stages.planning.context import make_context
        from coopflow.stages.tasks.taskset import build_taskset

        ctx = make_context(cfg, store, build_taskset(cfg.taskset, store), session=session)
        try:
            rounds = I.run_rounds(ctx, show_progress=show_progress)
        finally:
            ctx.session.close()
        ckpt = store.open_dir(rounds[-1]["checkpoint"])
        return {"algorithm": cfg.algorithm, "completed_rounds": len(rounds), "checkpoint": str(ckpt),
                "eval": I.round_eval(store, rounds[-1]["metrics"]), "executed": ctx.session.executed(),
                "env_steps": CheckpointLayout(ckpt).trainer_state().get("env_step", 0)}
    if cfg.algorithm in ("madpo", "marlhf"):
        from coopflow.stages.loops.preference import run_preference_direct

        out = run_preference_direct(cfg, store, session)
        out.pop("metrics", None)
        return {"algorithm": cfg.algorithm, **out}
    from coopflow.stages.loops.run import run_direct

    return {"algorithm": cfg.algorithm, **run_direct(cfg, store, show_progress, session=session)}
