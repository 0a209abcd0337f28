"""`trainer.train()`: the one run driver (`coopflow.flows.driver`, the same as `coopflow run` and the
deployments) with the inline runner: every step called in this process, no Prefect server. The run takes
the run-key lock, continues a killed run's MLflow run, publishes to the remote mirror and records lineage
exactly as a flow run does; it is tagged `coopflow.entry=python-api` (plus the trainer's `wandb_config` tags)
and named `<algorithm>-python-api` unless the config names it."""

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
