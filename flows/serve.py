"""Deployments: a flow + a config + an optional schedule + a name, served from this process (Prefect `serve`)
or registered on a work pool (Prefect `deploy`).

    coopflow serve configs/madpo-iter-story.yaml --cron '0 3 * * *'   # train-madpo-iter/story, one round a night
    coopflow serve                                # every flow, unscheduled, as '<flow>/local' (runs take --params)

A config names its flow: `algorithm:` (default magrpo), and `trainer.collaboration_mode: centralized` for
train-magrpo-centralized. The deployment is named after the config file without its algorithm prefix
(`madpo-iter-story.yaml` -> `story`) and runs it by absolute path; an iterative flow's deployment adds one round per
run (`max_new_rounds: 1`; a run that starts while another computes a round waits for it, then runs the next one).
A config is loaded exactly as its flow loads it (and pre-flighted, as a run would be) before anything is served,
so a config its flow refuses is refused here in one line, not at every tick.

The same deployments as YAML live in the repository's `prefect.yaml` (`prefect deploy --all`).
"""

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from coopflow.flows.driver import ITERATIVE as ITERATIVE_ALGORITHMS
from coopflow.flows.train import FLOWS, flow_config
from coopflow.schemas.config import ConfigError
from coopflow.schemas.config.loading import read_config_file

ITERATIVE = tuple(f"train-{a}" for a in ITERATIVE_ALGORITHMS)
"""The flows whose deployments add one round per run."""


@dataclass(frozen=True)
class Served:
    """One deployment to create: flow `flow`, named `name`, with default `parameters`."""

    flow: str
    name: str
    parameters: dict = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.flow}/{self.name}"


def flow_of(data: dict) -> str:
    """The flow a config dict names: `algorithm:` (default magrpo); centralized MAGRPO by its collaboration mode."""
    algo = str(data.get("algorithm") or "magrpo")
    mode = (data.get("trainer") or {}).get("collaboration_mode") if isinstance(data.get("trainer"), dict) else None
    name = "train-magrpo-centralized" if algo == "magrpo" and mode == "centralized" else f"train-{algo}"
    if name not in FLOWS:
        known = ", ".join(f.removeprefix("train-") for f in FLOWS)
        raise ConfigError(f"algorithm: {algo!r} is no flow (one of: {known})")
    return name


def deployment_name(path: Path, flow: str) -> str:
    """The config file's stem without its flow's algorithm prefix: magrpo-story.yaml -> story."""
    stem = path.stem
    rest = stem.removeprefix(flow.removeprefix("train-") + "-")
    return rest or stem


def from_config(path: str | Path, preflight: bool = True) -> Served:
    """The deployment of one config file, after loading it as its flow will (ConfigError: one line naming the
    file and what is wrong) and, with `preflight`, the model-free checks a run makes first."""
    p = Path(path).expanduser().resolve()
    data = read_config_file(p)
    flow = flow_of(data)
    try:
        cfg = flow_config(flow, config_path=str(p))
        if preflight:
            from coopflow.stages.operations.preflight import preflight as check

            check(cfg)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        hint = "" if "algorithm" in data else f" (the config names no `algorithm:`, so its flow is {flow})"
        raise ConfigError(f"{p.name} ({flow}): {err}{hint}") from None
    params = {"config_path": str(p)}
    if flow in ITERATIVE:  # a scheduled (or triggered) run adds one round to the experiment
        params["max_new_rounds"] = 1
    return Served(flow, deployment_name(p, flow), params)


def plan(configs: list[str] | None, name: str = "local", cron: str | None = None,
         interval: float | None = None, preflight: bool = True) -> list[Served]:
    """What `coopflow serve` / `deploy` create: one deployment per config, or every flow unscheduled under `name`.
    A schedule needs configs (a scheduled run with no config would run the defaults at every tick)."""
    if not configs:
        if cron or interval:
            raise ConfigError("a schedule needs the config it runs: name one or more config files, e.g. "
                              "`coopflow serve configs/madpo-iter-story.yaml --cron '0 3 * * *'`")
        return [Served(f, name, {"max_new_rounds": 1} if f in ITERATIVE else {}) for f in FLOWS]
    out = [from_config(c, preflight) for c in configs]
    seen: dict[str, str] = {}
    for c, s in zip(configs, out):
        if s.full_name in seen:
            raise ConfigError(f"{c} and {seen[s.full_name]} would both be deployment {s.full_name}: rename one file")
        seen[s.full_name] = c
    return out


def _schedule(cron: str | None, interval: float | None) -> dict:
    if cron:
        return {"cron": cron}
    return {"interval": timedelta(seconds=interval)} if interval else {}


def check_cron(cron: str | None) -> None:
    """A cron string Prefect accepts (five fields), else one line."""
    if cron is None:
        return
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise ConfigError(f"--cron {cron!r} is not a cron string (five fields: minute hour day month weekday, "
                          "e.g. '0 3 * * *')") from None


def deployments(served: list[Served], cron: str | None = None, interval: float | None = None) -> list:
    """Prefect deployment objects of `served` (each scheduled with `cron` or every `interval` seconds, if given)."""
    return [FLOWS[s.flow].to_deployment(name=s.name, parameters=s.parameters, tags=["coopflow"],
                                        **_schedule(cron, interval))
            for s in served]


def deploy_all(pool: str, served: list[Served], cron: str | None = None, interval: float | None = None,
               source: str | None = None) -> list[str]:
    """Register `served` on the work pool `pool` (Prefect `deploy`): workers started with
    `prefect worker start --pool <pool>` on any machine run them from `source` (this checkout by default, which
    must exist at the same path there, e.g. shared storage; or a git URL). Returns the deployment names."""
    from prefect import Flow

    src = source or str(Path(__file__).resolve().parents[1])
    out = []
    for s in served:
        flow = Flow.from_source(source=src, entrypoint=f"flows/train.py:{FLOWS[s.flow].fn.__name__}")
        flow.deploy(name=s.name, work_pool_name=pool, parameters=s.parameters, tags=["coopflow"],
                    print_next_steps=False, **_schedule(cron, interval))
        out.append(s.full_name)
    return out


def serve_all(served: list[Served], cron: str | None = None, interval: float | None = None) -> None:
    """Block serving the deployments until interrupted."""
    from prefect import serve

    serve(*deployments(served, cron, interval))
