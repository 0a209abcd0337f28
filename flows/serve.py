"""Serve every training flow as a deployment `<flow>/<name>` from this process (Prefect `serve`).

    coopflow serve                       # deployments train-magrpo/local, ... on a local server
    prefect deployment run 'train-magrpo/local' --params '{"config_path": "/abs/configs/magrpo-story.yaml"}' --watch

Runs execute as subprocesses of the serving process on this machine. For other machines use a
work pool instead (see README, "Scale out").
"""

from datetime import timedelta

from prefect import serve

from coopflow.flows.train import FLOWS


def deployments(name: str = "local", cron: str | None = None, interval: float | None = None,
                config_path: str | None = None) -> list:
    """One deployment per flow, optionally scheduled, with an optional default config_path."""
    params = {"config_path": config_path} if config_path else {}
    kw = {}
    if cron:
        kw["cron"] = cron
    elif interval:
        kw["interval"] = timedelta(seconds=interval)
    out = []
    for fname, f in FLOWS.items():
        p = dict(params)
        if fname in ("train-madpo-iter", "train-marlhf-iter"):  # a scheduled run adds one round to the experiment
            p["max_new_rounds"] = 1
        out.append(f.to_deployment(name=name, parameters=p, tags=["coopflow"], **kw))
    return out


def deploy_all(pool: str, name: str = "pool", cron: str | None = None, interval: float | None = None,
               config_path: str | None = None, source: str | None = None) -> list[str]:
    """Register one deployment per flow on the work pool `pool` (Prefect `deploy`): workers started with
    `prefect worker start --pool <pool>` on any machine run them from `source` (this checkout by default, which
    must exist at the same path there, e.g. shared storage; or a git URL). Returns the deployment names."""
    from pathlib import Path

    from prefect import Flow

    src = source or str(Path(__file__).resolve().parents[1])
    out = []
    for dep in deployments(name, cron, interval, config_path):
        fn = FLOWS[dep.flow_name].fn.__name__
        flow = Flow.from_source(source=src, entrypoint=f"flows/train.py:{fn}")
        kw = {"cron": cron} if cron else {"interval": timedelta(seconds=interval)} if interval else {}
        flow.deploy(name=name, work_pool_name=pool, parameters=dep.parameters, tags=["coopflow"],
                    print_next_steps=False, **kw)
        out.append(f"{dep.flow_name}/{name}")
    return out


def serve_all(name: str = "local", cron: str | None = None, interval: float | None = None,
              config_path: str | None = None) -> None:
    """Block serving the deployments until interrupted."""
    serve(*deployments(name, cron, interval, config_path))


if __name__ == "__main__":
    from coopflow.flows.env import configure

    configure()
    serve_all()
