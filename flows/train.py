"""Prefect flows: train-magrpo, -mareinforce, -marloo, -maremax, -iac, -maac, -madpo, -marlhf, -madpo-iter
and -marlhf-iter.

A flow is thin wiring around the one driver (`flows.driver`), the same one `trainer.train()` uses: the
flow loads its config and hands the driver a *Prefect runner*, which runs each step of the pipeline as
the Prefect task of the same name (a round of an iterative run as the `preference-round` subflow):

    build-taskset → prepare-agents → train-segment ×S → evaluate      (and optionally rescore)

The store, the run-key lock, the resumption of a killed run's MLflow run, lineage and tracking are the
driver's, so a flow run and a Python API run of one config make the same artifacts and MLflow record.
Tasks run at *segment* granularity (a checkpointed run of updates, default one epoch), not per update:
Prefect costs ~25 ms of CPU per task run on this class of machine, so per-update tasks would cost more
than the 10 % overhead budget; inside a segment the stages are plain calls that still write their
Parquet artifacts per update.

Caching is the artifact store's: every key is input-addressed and computable before running, so a
task whose output already exists returns its ref without loading a model. Prefect's own result
cache is off (NO_CACHE): a stale Prefect cache entry could point at a deleted artifact.

No `from __future__ import annotations` here: it breaks Prefect's parameter schema for deployments.
"""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.settings import get_current_settings
from prefect.utilities.annotations import quote

from coopflow.artifacts import ArtifactError, ArtifactStore
from coopflow.flows import driver as D
from coopflow.flows.driver import STAGES  # noqa: F401  (the stages a run can be limited to)
from coopflow.schemas.config import ConfigError, RunConfig, load_config
from coopflow.stages.planning import context as C

# Every flow here: prints logged, results returned in memory and never persisted (the artifact store holds what a run
# makes). Naming the (unused) result storage spares each flow run three requests for the server's default storage.
FLOW_OPTIONS: dict[str, Any] = dict(log_prints=True, persist_result=False,
                                    result_storage=Path(get_current_settings().results.local_storage_path))


def _no_retry_on_bad_input(task, task_run, state) -> bool:
    """Retry a step only for errors that a retry can fix (not bad config/numerics/corruption)."""
    try:
        state.result()
    except (ValueError, FloatingPointError, ArtifactError, ConfigError, FileNotFoundError, TypeError):
        return False
    except Exception:
        return True
    return False


# --- tasks: the driver's steps, each a Prefect task of the same name -------------------------------

RETRY = dict(retries=1, retry_condition_fn=_no_retry_on_bad_input)


def _task(name: str, **options):
    return task(D.STEPS[name], name=name, cache_policy=NO_CACHE, **options)


build_taskset_task = _task("build-taskset")
prepare_agents_task = _task("prepare-agents")
train_segment_task = _task("train-segment", task_run_name="train-segment-{index}", retry_delay_seconds=2, **RETRY)
evaluate_task = _task("evaluate", **RETRY)
evaluate_before_task = _task("evaluate-before", **RETRY)
refit_critic_task = _task("fit-critic", retry_condition_fn=_no_retry_on_bad_input)
rescore_task = _task("rescore")
candidates_task = _task("generate-candidates", **RETRY)
pairs_task = _task("build-pairs")
dpo_task = _task("dpo-update", **RETRY)
reward_model_task = _task("fit-reward-model", **RETRY)


@flow(name="preference-round", flow_run_name="round-{r}", **FLOW_OPTIONS, validate_parameters=False)
def round_flow(ctx: Any, r: int, show_progress: bool = False) -> dict:  # ctx: a RunContext (Any: no schema)
    """One round: target + comparator candidates, aligned pairs (a replay shard), replay, training, eval."""
    return D.round_step(ctx, r, show_progress)


TASKS = {t.name: t for t in (build_taskset_task, prepare_agents_task, train_segment_task, evaluate_task,
                             evaluate_before_task, refit_critic_task, rescore_task, candidates_task, pairs_task,
                             dpo_task, reward_model_task, round_flow)}
"""Every driver step as its Prefect task (or subflow), by name."""


def _quoted(t):
    """Call a task with its run context and store quoted (Prefect neither walks nor records those objects)."""
    def call(*args):
        return t(*[quote(a) if isinstance(a, (C.RunContext, ArtifactStore)) else a for a in args])

    return call


def prefect_runner() -> D.Runner:
    """The driver's runner inside a flow run: each step a Prefect task; MLflow tags name the flow run."""
    from prefect.runtime import flow_run

    tags = {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": str(flow_run.name)}
    return D.Runner({name: _quoted(t) for name, t in TASKS.items()}, get_run_logger(), tags)


# --- the flow bodies: a config, then the driver with the Prefect runner ---------------------------


def flow_config(flow_name: str, config: dict | None = None, config_path: str | None = None,
                overrides: dict[str, Any] | list[str] | None = None) -> RunConfig:
    """The config of a run of flow `flow_name`, validated exactly as that flow loads it (file, then the inline
    `config` merged over it, then `overrides`); `coopflow serve` checks a config with it before serving."""
    algorithm = flow_name.removeprefix("train-")
    if flow_name == "train-magrpo-centralized":  # train-magrpo with collaboration_mode forced centralized
        algorithm = "magrpo"
        if isinstance(overrides, list):
            overrides = [*overrides, "trainer.collaboration_mode=centralized"]
        else:
            overrides = {**(overrides or {}), "trainer.collaboration_mode": "centralized"}
    return load_config(config_path, overrides, algorithm=algorithm, base=config)


def run_training(algorithm: str, config: dict | None = None, config_path: str | None = None,
                 overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
                 refresh: list[str] | None = None, rescore_from: str | None = None,
                 show_progress: bool = False, continue_run: str | None = None) -> dict:
    """Validate the config and run the training pipeline (`flows.driver.train`); returns the run summary."""
    cfg = flow_config(f"train-{algorithm}", config, config_path, overrides)
    return D.train(cfg, prefect_runner(), stages, refresh, rescore_from, show_progress, continue_run)


def _no_pref_option(rescore_from, continue_run, algorithm: str) -> None:
    if rescore_from or continue_run:
        raise ConfigError(f"train-{algorithm} does not take rescore_from / continue_run (its stages are cached by "
                          "key: rerunning the same config reuses them)")


def run_preference(algorithm: str, config: dict | None, config_path: str | None, overrides, stages, refresh,
                   show_progress: bool) -> dict:
    """MADPO / MARLHF (`flows.driver.preference`)."""
    cfg = flow_config(f"train-{algorithm}", config, config_path, overrides)
    return D.preference(cfg, prefect_runner(), stages, refresh, show_progress)


def run_iterative(algorithm: str, config: dict | None, config_path: str | None,
                  overrides: dict[str, Any] | list[str] | None, max_new_rounds: int | None,
                  show_progress: bool = False) -> dict:
    """The rounds of an iterative experiment (`flows.driver.iterative`)."""
    cfg = flow_config(f"train-{algorithm}", config, config_path, overrides)
    return D.iterative(cfg, prefect_runner(), max_new_rounds, show_progress)


# --- the MAGRPO-family and actor-critic flows (same graph, the algorithm's update) --------------


def _run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    src = p.get("config_path") or "inline-config"
    return f"{flow_run.flow_name}: {src}"


def _training_flow(algorithm: str, doc: str):
    """The Prefect flow `train-<algorithm>`: one graph of stage tasks (`run_training`), one algorithm."""

    def train(config: dict | None = None, config_path: str | None = None,
              overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
              refresh: list[str] | None = None, rescore_from: str | None = None,
              show_progress: bool = False, continue_run: str | None = None) -> dict:
        return run_training(algorithm, config, config_path, overrides, stages, refresh, rescore_from, show_progress,
                            continue_run)

    train.__doc__ = doc
    train.__name__ = train.__qualname__ = f"train_{algorithm}"  # importable as flows.train:train_<algorithm>
    return flow(name=f"train-{algorithm}", flow_run_name=_run_name, **FLOW_OPTIONS)(train)


train_magrpo = _training_flow("magrpo", "MAGRPO: group-mean baseline.")
train_mareinforce = _training_flow("mareinforce", "MAREINFORCE: no baseline (advantage = return).")
train_marloo = _training_flow("marloo", "MARLOO: leave-one-out baseline.")
train_maremax = _training_flow("maremax", "MAReMax: group-max baseline.")
train_iac = _training_flow("iac", "IAC: independent actor-critic (a critic per agent).")
train_maac = _training_flow("maac", "MAAC: one centralized critic over the joint history.")


@flow(name="train-magrpo-centralized", flow_run_name=_run_name, **FLOW_OPTIONS)
def train_magrpo_centralized(config: dict | None = None, config_path: str | None = None,
                             overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
                             refresh: list[str] | None = None, rescore_from: str | None = None,
                             show_progress: bool = False, continue_run: str | None = None) -> dict:
    """Centralized MAGRPO: one joint actor writes every role's output (train-magrpo with collaboration_mode
    centralized)."""
    cfg = flow_config("train-magrpo-centralized", config, config_path, overrides)
    return D.train(cfg, prefect_runner(), stages, refresh, rescore_from, show_progress, continue_run)


@flow(name="train-madpo", flow_run_name=_run_name, **FLOW_OPTIONS)
def train_madpo(config: dict | None = None, config_path: str | None = None,
                overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
                refresh: list[str] | None = None, show_progress: bool = False, rescore_from: str | None = None,
                continue_run: str | None = None) -> dict:
    """MADPO: offline joint-factorized DPO on task-reward preference pairs."""
    _no_pref_option(rescore_from, continue_run, "madpo")
    return run_preference("madpo", config, config_path, overrides, stages, refresh, show_progress)


@flow(name="train-marlhf", flow_run_name=_run_name, **FLOW_OPTIONS)
def train_marlhf(config: dict | None = None, config_path: str | None = None,
                 overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
                 refresh: list[str] | None = None, show_progress: bool = False, rescore_from: str | None = None,
                 continue_run: str | None = None) -> dict:
    """MARLHF: joint reward model on preference pairs, then online MARL on it (eval on the task reward)."""
    _no_pref_option(rescore_from, continue_run, "marlhf")
    return run_preference("marlhf", config, config_path, overrides, stages, refresh, show_progress)


# --- iterative (online) MADPO / MARLHF: one subflow per round -----------------------------------


@flow(name="train-madpo-iter", flow_run_name=_run_name, **FLOW_OPTIONS)
def train_madpo_iter(config: dict | None = None, config_path: str | None = None,
                     overrides: dict[str, Any] | list[str] | None = None, max_new_rounds: int | None = None,
                     show_progress: bool = False) -> dict:
    """Iterative MADPO: rounds resume from the store; `max_new_rounds=1` runs the next round (for schedules)."""
    return run_iterative("madpo-iter", config, config_path, overrides, max_new_rounds, show_progress)


@flow(name="train-marlhf-iter", flow_run_name=_run_name, **FLOW_OPTIONS)
def train_marlhf_iter(config: dict | None = None, config_path: str | None = None,
                      overrides: dict[str, Any] | list[str] | None = None, max_new_rounds: int | None = None,
                      show_progress: bool = False) -> dict:
    """Iterative MARLHF: per round a fresh reward model on the round's pairs, then RL on it (eval: task reward)."""
    return run_iterative("marlhf-iter", config, config_path, overrides, max_new_rounds, show_progress)


FLOWS = {"train-magrpo": train_magrpo, "train-magrpo-centralized": train_magrpo_centralized,
         "train-mareinforce": train_mareinforce,
         "train-marloo": train_marloo, "train-maremax": train_maremax, "train-iac": train_iac,
         "train-maac": train_maac, "train-madpo": train_madpo, "train-marlhf": train_marlhf,
         "train-madpo-iter": train_madpo_iter, "train-marlhf-iter": train_marlhf_iter}
