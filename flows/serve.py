"""Serve every training flow as a deployment `<flow>/<name>` from this process (Prefect `serve`).

    coopflow serve                       # deployments train-magrpo/local, ... on a local server
    prefect deployment run 'train-magrpo/local' --params '{"config_path": "/abs/configs/magrpo-story.yaml"}' --watch

Runs execute as subprocesses of the serving process on this machine. For other machines use a
work pool instead (see README, "Scale out").
"""

from datetime import timedelta

from prefect import serve

from flows.train import FLOWS


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


def serve_all(name: str = "local", cron: str | None = None, interval: float | None = None,
              config_path: str | None = None) -> None:
    """Block serving the deployments until interrupted."""
    serve(*deployments(name, cron, interval, config_path))


if __name__ == "__main__":
    from flows.env import configure

    configure()
    serve_all()
