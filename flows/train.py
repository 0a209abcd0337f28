"""Prefect flows: train-magrpo, -mareinforce, -marloo, -maremax, -iac, -maac, -madpo, -marlhf, -madpo-iter
and -marlhf-iter.

The MAGRPO family (train-magrpo, -mareinforce, -marloo, -maremax) and actor-critic (train-iac, train-maac)
flows are one graph of stages; the segment stage runs the algorithm's update (for the MAGRPO family, the
same update with a different default advantage mode):

    build-taskset → prepare-agents → train-segment ×S → evaluate      (and optionally rescore)

Each box is a Prefect task wrapping a plain stage from `stages/`. The loops themselves are the stages'
(`stages.loops.run.run_segments`, `stages.loops.rounds.run_rounds`): a flow hands them a runner that
wraps each segment in the `train-segment` task (each round in the `preference-round` subflow) and a
callback that logs the result to MLflow, so the flows and the direct path run the same loop. Tasks run
at *segment* granularity (a checkpointed run of updates, default one epoch), not per update: Prefect
costs ~25 ms of CPU per task run on this class of machine, so per-update tasks would cost more than the
10 % overhead budget; inside a segment the stages are plain calls that still write their Parquet
artifacts per update.

Caching is the artifact store's: every key is input-addressed and computable before running, so a
task whose output already exists returns its ref without loading a model. Prefect's own result
cache is off (NO_CACHE): a stale Prefect cache entry could point at a deleted artifact.

No `from __future__ import annotations` here: it breaks Prefect's parameter schema for deployments.
"""

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.settings import get_current_settings
from prefect.utilities.annotations import quote

from coopflow.artifacts import ArtifactError, ArtifactRef, ArtifactStore
from coopflow.flows.tracking import Tracker, reward_curve_svg, tracker_for
from coopflow.schemas.config import ConfigError, RunConfig, load_config
from coopflow.stages.loops import context as C
from coopflow.stages.loops import run as R
from coopflow.stages.agents.checkpoint import policy_key_of
from coopflow.stages.loops.keys import eval_key
from coopflow.stages.loops.segment import SegmentResult, train_segment
from coopflow.stages.tasks.taskset import build_taskset

# Every flow here: prints logged, results returned in memory and never persisted (the artifact store holds what a run
# makes). Naming the (unused) result storage spares each flow run three requests for the server's default storage.
FLOW_OPTIONS: dict[str, Any] = dict(log_prints=True, persist_result=False,
                                    result_storage=Path(get_current_settings().results.local_storage_path))

STAGES = ("taskset", "train", "evaluate", "score", "critic")
"""Stages a flow run can be limited to with `stages=[...]`; 'score' re-scores stored rollouts."""


def _public(cfg: RunConfig) -> dict:
    """The config as logged to MLflow: secrets (the API key, header values other than 'env:VAR' references) are
    masked, never logged."""
    data = cfg.model_dump(mode="json")
    t = data.get("trainer") or {}
    if t.get("comparator_api_key"):
        t["comparator_api_key"] = "***"
    if t.get("comparator_api_headers"):
        t["comparator_api_headers"] = {k: v if str(v).startswith("env:") else "***"
                                       for k, v in t["comparator_api_headers"].items()}
    return data


def _use_threads(cfg: RunConfig, logger) -> None:
    """Set this run's torch threads (agents.torch_threads, else derived so runs never oversubscribe the CPUs)."""
    from coopflow.stages.common.threads import apply_threads

    n, why = apply_threads(cfg.agents.torch_threads)
    logger.info("torch threads: %d (%s)", n, why)


def _no_retry_on_bad_input(task, task_run, state) -> bool:
    """Retry a segment only for errors that a retry can fix (not bad config/numerics/corruption)."""
    try:
        state.result()
    except (ValueError, FloatingPointError, ArtifactError, ConfigError, FileNotFoundError, TypeError):
        return False
    except Exception:
        return True
    return False


# --- tasks ---------------------------------------------------------------------------------------


@task(name="build-taskset", cache_policy=NO_CACHE)
def build_taskset_task(cfg: RunConfig, store: ArtifactStore) -> ArtifactRef:
    """Build or reuse the taskset artifact."""
    return build_taskset(cfg.taskset, store)


@task(name="prepare-agents", cache_policy=NO_CACHE)
def prepare_agents_task(cfg: RunConfig, store: ArtifactStore) -> tuple[list[str], dict]:
    """Resolve agent sources (building the tiny model artifact when asked)."""
    return C.resolve_sources(cfg, store)


@task(name="train-segment", task_run_name="train-segment-{index}", cache_policy=NO_CACHE, retries=1,
      retry_delay_seconds=2, retry_condition_fn=_no_retry_on_bad_input)
def train_segment_task(ctx: C.RunContext, index: int, start: ArtifactRef | None, start_key: str,
                       show_progress: bool) -> SegmentResult:
    """Train one segment, or return its stored checkpoint/steps/metrics when already done."""
    res = train_segment(ctx, index, start, start_key, show_progress=show_progress)
    if res.cached:
        get_run_logger().info("segment %d cached: checkpoint %s", index, res.checkpoint.key)
    return res


def segment_runner(show_progress: bool):
    """The segment loop's `run_segment`: each segment a Prefect task run."""
    def run(ctx: C.RunContext, index: int, start: ArtifactRef | None, start_key: str) -> SegmentResult:
        return train_segment_task(quote(ctx), index, start, start_key, show_progress)

    return run


@task(name="evaluate", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_no_retry_on_bad_input)
def evaluate_task(ctx: C.RunContext, ckpt: ArtifactRef, refresh: bool) -> tuple[ArtifactRef, dict]:
    """Single-path evaluation of a checkpoint on the eval split."""
    if refresh:
        ctx.store.remove("eval", eval_key(ctx, policy_key_of(ckpt.key)))
    return R.evaluate_checkpoint(ctx, ckpt)


@task(name="evaluate-before", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_no_retry_on_bad_input)
def evaluate_before_task(ctx: C.RunContext) -> tuple[ArtifactRef, dict]:
    """The initial policies on the final evaluation's items and seed (the 'before' of before/after)."""
    return R.evaluate_initial(ctx)


@task(name="fit-critic", cache_policy=NO_CACHE, retry_condition_fn=_no_retry_on_bad_input)
def refit_critic_task(ctx: C.RunContext, ckpt: ArtifactRef, steps_refs: list[ArtifactRef]) -> tuple[ArtifactRef, dict]:
    """Re-fit the trained critic(s) on the run's stored actor-critic samples (no generation)."""
    return R.refit_critic(ctx, ckpt, steps_refs)


@task(name="rescore", cache_policy=NO_CACHE)
def rescore_task(ctx: C.RunContext, steps_refs: list[ArtifactRef]) -> list[dict]:
    """Re-score stored rollouts with the configured reward; returns per-update metric rows."""
    return R.rescore(ctx, steps_refs)


# --- the flow body -------------------------------------------------------------------------------


def run_training(algorithm: str, config: dict | None = None, config_path: str | None = None,
                 overrides: dict[str, Any] | list[str] | None = None, stages: list[str] | None = None,
                 refresh: list[str] | None = None, rescore_from: str | None = None,
                 show_progress: bool = False, continue_run: str | None = None) -> dict:
    """Validate the config, chain the stage tasks, track in MLflow; returns the run summary.

    `continue_run` (an MLflow run id) continues an earlier, shorter run of the same config (e.g. 1 epoch,
    now 3): its segments are reused and the new ones log into that same MLflow run, env_step continuing.
    """
    cfg = load_config(config_path, overrides, algorithm=algorithm, base=config)
    stages = list(stages or ["taskset", "train", "evaluate"])
    refresh = list(refresh or [])
    bad = [s for s in stages + refresh if s not in STAGES]
    if bad:
        raise ConfigError(f"unknown stage(s) {bad}; choose from {list(STAGES)}")
    if "score" in stages and not rescore_from:
        raise ConfigError("stages=['score'] re-scores the rollouts of an earlier run: pass rescore_from=<run_key>")
    logger = get_run_logger()
    _use_threads(cfg, logger)
    data = cfg.resolved_data_dir()
    store = ArtifactStore.of(cfg)
    store.clean_temp()
    tr = cfg.tracking
    tracker = tracker_for(cfg)

    # --- plan (no model is loaded here)
    taskset = build_taskset_task(cfg, quote(store))
    sources, ident = prepare_agents_task(cfg, quote(store))
    ctx = C.make_context(cfg, store, taskset, sources, ident)
    ends = list(ctx.end_keys)
    run_key = ctx.run_key
    try:
        from prefect.runtime import flow_run
        prefect_tags = {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": str(flow_run.name)}
    except Exception:  # pragma: no cover - outside a flow run
        prefect_tags = {}
    # One run of a run key at a time (two identical runs at once: the second waits, then reuses what the first
    # stored and continues its MLflow run instead of duplicating both); released in `finally` or by process death.
    lock = store.lock(f"run-{run_key}", [ctx.plan.start_key, *ends])
    t_wait = int(time.time() * 1000)
    waited = lock.__enter__()
    ok = False
    try:
        resumed = tracker.finished_run(run_key, t_wait) if waited and not continue_run else None
        if resumed:
            logger.info("%s: an identical run finished while this one waited; reusing its artifacts and MLflow "
                        "run %s", algorithm, resumed)
        if continue_run:
            _check_continuation(tracker, continue_run, ends)
        elif not resumed:  # a run of this key whose process was killed: continue that MLflow run, close older ones
            dead = tracker.dead_runs(run_key)
            if dead:
                resumed = dead[-1]
                for rid in dead[:-1]:
                    tracker.mark_killed(rid)
        tracker.record("taskset", taskset, tag=True)  # (a new run gets its queued tags with its params, in one call)
        run_id = tracker.start(tr.run_name or f"{algorithm}-{run_key[:8]}",
                               {"coopflow.algorithm": algorithm, "coopflow.run_key": run_key, **prefect_tags},
                               _public(cfg), run_id=continue_run or resumed)
        if continue_run or resumed:
            tracker.tag({"coopflow.run_key": run_key, **prefect_tags})
        if resumed and not waited:
            tracker.tag({"coopflow.resumed_after_kill": "true"})
            logger.info("%s: continuing MLflow run %s, whose process was killed", algorithm, resumed)
        logger.info("%s: %s in %d segment(s), run_key %s, mlflow run %s", algorithm, ctx.plan.budget.describe(),
                    len(ctx.plan.segments), run_key, run_id)
        for w in ctx.plan.warnings:
            logger.warning(w)
        tracker.log_dataset(f"taskset-{cfg.taskset.name}", taskset)
        tracker.flush()
        summary: dict[str, Any] = {"algorithm": algorithm, "run_key": run_key, "mlflow_run_id": run_id,
                                   "budget": ctx.plan.budget.as_dict(), "warnings": list(ctx.plan.warnings)}

        # --- evaluate the initial policies (before), on the same items and eval seed as the final evaluation
        if cfg.eval_before and "train" in stages and "evaluate" in stages:
            eb_ref, eb = evaluate_before_task(quote(ctx))
            tracker.record("eval_before", eb_ref)
            tracker.log_metrics([{"key": "eval_before/" + k.removeprefix("eval/"), "value": v, "env_step": 0}
                                 for k, v in eb.items()], flush=False)
            summary["eval_before"] = eb

        # --- train (segment by segment; cached segments return their stored refs)
        trained = None
        if "train" in stages:
            if "train" in refresh:
                raise ConfigError("refresh=['train'] is not supported: training artifacts are input-addressed and "
                                  "never stale; change the seed or config to train anew")

            def track_segment(i: int, res: SegmentResult) -> None:
                if not ((continue_run or resumed) and res.cached):  # a continued run already has those points
                    tracker.log_metrics(store.read_rows(res.metrics))
                tracker.record(f"checkpoint.segment_{i}", res.checkpoint)

            trained = R.run_segments(ctx, segment_runner(show_progress), track_segment)
        elif "evaluate" in stages or "critic" in stages:
            trained = R.stored_training(ctx)
        ckpt = trained.checkpoint if trained else None
        steps_rows = trained.steps_rows if trained else []
        env_steps = trained.env_steps if trained else 0
        if trained:
            for kind, ref in R.run_lineage(store, trained):
                tracker.record(kind, ref)
            tracker.record("checkpoint.final", ckpt, tag=True)
            summary.update(R.training_summary(store, trained))

        # --- evaluate
        if "evaluate" in stages:
            ev_ref, ev = evaluate_task(quote(ctx), ckpt, "evaluate" in refresh)
            tracker.record("eval", ev_ref, tag=True)
            tracker.log_metrics([{"key": k, "value": v, "env_step": env_steps} for k, v in ev.items()], flush=False)
            summary["eval"] = ev

        # --- re-fit the critic(s) on the stored samples (actor-critic runs)
        if "critic" in stages:
            if ckpt is None:
                raise ConfigError("no trained checkpoint for this config yet: run the 'train' stage first")
            cref, cm = refit_critic_task(quote(ctx), ckpt, trained.steps_refs)
            tracker.record("critic", cref, tag=True)
            tracker.log_metrics([{"key": k, "value": v, "env_step": env_steps} for k, v in cm.items()], flush=False)
            summary["critic_refit"] = {**cm, "artifact": str(store.open_dir(cref))}

        # --- re-score stored rollouts of an earlier run with this config's reward
        if "score" in stages:
            src = [store.find("steps", k) for k in R.segment_keys_of(store, rescore_from)]
            rows = rescore_task(quote(ctx), src)
            tracker.log_metrics(rows, flush=False)
            vals = [r["value"] for r in rows]
            summary["rescore"] = dict(zip(("reward_first", "reward_last"), R.first_last_fifth(vals)),
                                      updates=len(vals), source_run_key=rescore_from)

        summary["executed"] = ctx.session.executed()
        _log_run_files(tracker, store, cfg, summary, steps_rows, f"{algorithm} {run_key[:8]}")
        tracker.log_metrics([{"key": "final_model_saved", "value": 1.0, "env_step": env_steps}])
        ok = True
        return summary
    finally:
        ctx.session.close()
        tracker.finish(ok)
        lock.__exit__(None, None, None)


def _check_continuation(tracker: Tracker, run_id: str, ends: list[str]) -> None:
    """The MLflow run to continue must have trained a prefix of this config's segments."""
    if not tracker.enabled:
        raise ConfigError("continue_run needs MLflow tracking (tracking.enabled: true)")
    try:
        prev = tracker.client.get_run(run_id)
    except Exception as err:
        raise ConfigError(f"continue_run={run_id!r}: no such MLflow run ({err.__class__.__name__})") from None
    prev_key = prev.data.tags.get("coopflow.run_key")
    if prev_key not in ends:
        raise ConfigError(f"continue_run={run_id!r} trained run_key {prev_key!r}, which is not a segment of this "
                          "config's training; only a longer run of the same config (e.g. more epochs) can continue it")


def _log_run_files(tracker: Tracker, store: ArtifactStore, cfg: RunConfig, summary: dict, steps: list[dict],
                   title: str) -> None:
    if not tracker.enabled:
        return
    files: dict[str, Any] = {"summary.json": summary, "config.json": _public(cfg),
                             "lineage.json": tracker.lineage}
    if steps:
        files["reward_curve.svg"] = reward_curve_svg([r["env_step"] for r in steps], [r["reward_mean"] for r in steps],
                                                     title).encode()
        last = store.find("rollouts", steps[-1]["rollouts"])
        if last is not None and cfg.tracking.sample_rollouts:
            keep = ("item_id", "agent", "sample", "prompt", "completion_text", "length", "finished")
            files["rollout_samples.json"] = [{k: r[k] for k in keep}
                                             for r in store.read_rows(last)[:cfg.tracking.sample_rollouts]]
    tracker.log_files(files)


# --- preference learning (MADPO, MARLHF) --------------------------------------------------------


@task(name="generate-candidates", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_no_retry_on_bad_input)
def candidates_task(ctx: C.RunContext) -> tuple[ArtifactRef, ArtifactRef]:
    """P aligned joint candidates per item, scored with the task reward."""
    from coopflow.stages.loops import preference as P

    return P.generate_candidates(ctx)


@task(name="build-pairs", cache_policy=NO_CACHE)
def pairs_task(ctx: C.RunContext, cand: ArtifactRef, scores: ArtifactRef) -> ArtifactRef:
    """Preference pairs (ties dropped, selected by pair_selection)."""
    from coopflow.stages.loops import preference as P

    return P.make_pairs(ctx, cand, scores)


@task(name="dpo-update", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_no_retry_on_bad_input)
def dpo_task(ctx: C.RunContext, pairs: ArtifactRef, show_progress: bool) -> dict:
    """Joint-factorized DPO over the pairs -> checkpoint, metrics."""
    from coopflow.stages.loops import preference as P

    return P.train_dpo(ctx, pairs, show_progress)


@task(name="fit-reward-model", cache_policy=NO_CACHE, retries=1, retry_condition_fn=_no_retry_on_bad_input)
def reward_model_task(ctx: C.RunContext, pairs: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """Bradley-Terry joint reward model on the pairs."""
    from coopflow.stages.loops import preference as P

    return P.fit_rm(ctx, pairs)


def _no_pref_option(rescore_from, continue_run, algorithm: str) -> None:
    if rescore_from or continue_run:
        raise ConfigError(f"train-{algorithm} does not take rescore_from / continue_run (its stages are cached by "
                          "key: rerunning the same config reuses them)")


def run_preference(algorithm: str, config: dict | None, config_path: str | None, overrides, stages, refresh,
                   show_progress: bool) -> dict:
    """MADPO / MARLHF: candidates -> pairs -> (DPO | reward model -> RL) -> evaluate, tracked in MLflow."""
    from coopflow.stages.loops import preference as P

    cfg = load_config(config_path, overrides, algorithm=algorithm, base=config)
    stages = list(stages or ["taskset", "train", "evaluate"])
    refresh = list(refresh or [])
    bad = [s for s in stages + refresh if s not in ("taskset", "train", "evaluate")]
    if bad:
        raise ConfigError(f"unknown stage(s) {bad} for train-{algorithm}; choose from ['taskset', 'train', 'evaluate']")
    logger = get_run_logger()
    _use_threads(cfg, logger)
    data = cfg.resolved_data_dir()
    store = ArtifactStore.of(cfg)
    store.clean_temp()
    tr = cfg.tracking
    tracker = tracker_for(cfg)
    taskset = build_taskset_task(cfg, quote(store))
    ctx = P.preference_context(cfg, store, taskset)
    run_id = tracker.start(tr.run_name or f"{algorithm}-{P.pairs_key(ctx)[:8]}", {"coopflow.algorithm": algorithm},
                           _public(cfg))
    logger.info("%s: %s, pairs key %s, mlflow run %s", algorithm, ctx.plan.budget.describe(), P.pairs_key(ctx),
                run_id)
    ok = False
    try:
        summary: dict[str, Any] = {"algorithm": algorithm, "mlflow_run_id": run_id,
                                   "budget": ctx.plan.budget.as_dict()}
        tracker.record("taskset", taskset, tag=True)
        cand, scores = candidates_task(quote(ctx))
        pairs = pairs_task(quote(ctx), cand, scores)
        for kind, ref in (("rollouts", cand), ("scores", scores), ("pairs", pairs)):
            tracker.record(kind, ref, tag=True)
        summary["pair_count"] = len({r["pair_id"] for r in store.read_rows(pairs)})
        env_steps, eval_ctx, ckpt = 0, ctx, None
        if algorithm == "madpo":
            res = dpo_task(quote(ctx), pairs, show_progress)
            ckpt = res["checkpoint"]
            rows = store.read_rows(res["metrics"])
            tracker.log_metrics(rows)
            env_steps = max((r["env_step"] for r in rows), default=0)
            summary["run_key"] = ckpt.key
        else:
            rm_ref, rm_metrics = reward_model_task(quote(ctx), pairs)
            tracker.record("reward_model", rm_ref, tag=True)
            tracker.log_metrics([{"key": k, "value": v, "env_step": 0} for k, v in rm_metrics.items()])
            summary["reward_model"] = {**rm_metrics, "artifact": str(store.open_dir(rm_ref))}
            rctx = P.rl_context(ctx, rm_ref)
            trained = R.run_segments(rctx, segment_runner(show_progress),
                                     lambda i, res: tracker.log_metrics(store.read_rows(res.metrics)))
            ckpt, env_steps = trained.checkpoint, trained.env_steps
            first, last = trained.first_last()
            summary.update(rm_reward_first=first, rm_reward_last=last, run_key=policy_key_of(ckpt.key))
            eval_ctx = rctx
        tracker.record("checkpoint.final", ckpt, tag=True)
        summary.update(env_steps=env_steps, checkpoint=str(store.open_dir(ckpt)))
        if "evaluate" in stages:  # always with the task reward
            ev_ref, ev = evaluate_task(quote(eval_ctx), ckpt, "evaluate" in refresh)
            tracker.record("eval", ev_ref, tag=True)
            tracker.log_metrics([{"key": k, "value": v, "env_step": env_steps} for k, v in ev.items()], flush=False)
            summary["eval"] = ev
        summary["executed"] = ctx.session.executed()
        _log_run_files(tracker, store, cfg, summary, [], None)
        tracker.log_metrics([{"key": "final_model_saved", "value": 1.0, "env_step": env_steps}])
        ok = True
        return summary
    finally:
        ctx.session.close()
        tracker.finish(ok)


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
    forced = {"trainer.collaboration_mode": "centralized"}
    if isinstance(overrides, list):
        overrides = [*overrides, "trainer.collaboration_mode=centralized"]
    else:
        overrides = {**(overrides or {}), **forced}
    return run_training("magrpo", config, config_path, overrides, stages, refresh, rescore_from, show_progress,
                        continue_run)


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


@flow(name="preference-round", flow_run_name="round-{r}", **FLOW_OPTIONS, validate_parameters=False)
def round_flow(ctx: Any, r: int, show_progress: bool = False) -> dict:  # ctx: a RunContext (Any: no schema)
    """One round: target + comparator candidates, aligned pairs (a replay shard), replay, training, eval."""
    from coopflow.stages.loops import rounds as I

    return I.run_round(ctx, r, show_progress)


def _parent_run(tracker: Tracker, exp_key: str, name: str, params: dict, algorithm: str) -> str | None:
    """The experiment's MLflow parent run: reopened when an earlier (scheduled) run created it."""
    if not tracker.enabled:
        return None
    found = tracker.client.search_runs([tracker.experiment_id], f"tags.`coopflow.iter_experiment` = '{exp_key}'",
                                       max_results=1)
    if found:
        return tracker.start(name, {}, params, run_id=found[0].info.run_id)
    return tracker.start(name, {"coopflow.iter_experiment": exp_key, "coopflow.algorithm": algorithm}, params)


def run_iterative(algorithm: str, config: dict | None, config_path: str | None,
                  overrides: dict[str, Any] | list[str] | None, max_new_rounds: int | None,
                  show_progress: bool = False) -> dict:
    """The rounds of an iterative experiment, resumed from the store; one MLflow child run per round."""
    from coopflow.stages.loops import rounds as I
    from coopflow.stages.evaluate.reward_drift import bar_svg

    cfg = load_config(config_path, overrides, algorithm=algorithm, base=config)
    data = cfg.resolved_data_dir()
    store = ArtifactStore.of(cfg)
    store.clean_temp()
    tr = cfg.tracking
    parent = tracker_for(cfg)
    taskset = build_taskset_task(cfg, quote(store))
    ctx = C.make_context(cfg, store, taskset)
    keys = I.round_keys(ctx)
    done = I.completed_rounds(ctx)
    run_id = _parent_run(parent, keys[0], tr.run_name or f"{algorithm}-{keys[0][:8]}", _public(cfg), algorithm)
    logger = get_run_logger()
    _use_threads(cfg, logger)
    logger.info("%s: %d of %d rounds stored; mlflow parent run %s", algorithm, done, len(keys), run_id)
    ok, ran, warnings = False, [], list(ctx.plan.warnings)
    summary = {"algorithm": algorithm, "mlflow_run_id": run_id, "rounds": len(keys)}

    def track_round(r: int, res: dict) -> None:
        """MLflow: the round's metrics on the parent run, and a child run with its artifacts."""
        for w in res["warnings"]:
            logger.warning(w)
            if w not in warnings:
                warnings.append(w)
        rows = store.read_rows(res["metrics"])
        parent.log_metrics(rows)
        child = tracker_for(cfg)
        child.start(f"round-{r}", {"mlflow.parentRunId": run_id or "", "coopflow.round": str(r)}, {})
        child.log_metrics(rows)
        for ref in res.get("rl_metrics") or []:  # MARLHF-iter: the RL phase's per-update metrics
            child.log_metrics(store.read_rows(ref))
        child.record("checkpoint", res["checkpoint"], tag=True)
        child.record("pairs", res["shard"], tag=True)
        if res.get("drift"):
            name = f"reward_distributions/iteration_{r:04d}"
            child.log_files({f"{name}.json": res["drift"],
                             f"{name}_candidates.html": bar_svg(res["drift"]).encode(),
                             f"{name}_selected.html": bar_svg(res["drift"], "selected").encode()})
        child.finish(True)
        ran.append(r)

    try:
        I.run_rounds(ctx, max_new_rounds, lambda c, r: round_flow(quote(c), r, show_progress), track_round,
                     show_progress)
        summary.update(completed_rounds=I.completed_rounds(ctx), ran_rounds=ran)
        if warnings:
            summary["warnings"] = warnings
        last = store.find("checkpoint", keys[summary["completed_rounds"] - 1]) if summary["completed_rounds"] else None
        if last is not None:
            summary["checkpoint"] = str(store.open_dir(last))
            summary["eval"] = I.round_eval(store, store.find("metrics", last.key))
        ok = True
        return summary
    finally:
        ctx.session.close()
        parent.finish(ok)


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
