"""One driver for every entry point: `coopflow run`, served deployments and `trainer.train()`.

Whatever starts a run, this module does what a run does around its stages:

- opens the config's store with `ArtifactStore.of` (`<data_dir>/artifacts`, mirrored to `remote_store`
  or $COOPFLOW_REMOTE_STORE) and clears temp dirs left by killed writers;
- takes the run-key lock: one run of a run key at a time on a data dir (a second identical run waits,
  then reuses what the first stored and continues its MLflow run); continues the MLflow run of a killed
  process (or `continue_run`, an earlier shorter run of the same config);
- tracks the run in MLflow through `RunLog`: params, metrics by env_step, lineage tags, run files.

The entry points differ only in their `Runner`, which says how one *step* runs. A step is a stage function
(`STEPS`, named like its Prefect task): the flows' runner (`flows.train.prefect_runner`) runs each as its
Prefect task (a round of an iterative run as its subflow) inside the flow run; `inline_runner` calls it in
this process and needs no Prefect server (the Python API). A runner also carries the MLflow tags and default
run name of its entry point and, for the Python API, the trainer's live agents to train in place.

The pipelines:

    train       build-taskset → prepare-agents → [evaluate-before] → train-segment ×S → evaluate
                → [fit-critic] → [rescore]                                 (MAGRPO family, IAC, MAAC)
    preference  build-taskset → generate-candidates → build-pairs → dpo-update | fit-reward-model
                → train-segment ×S → evaluate                                      (MADPO, MARLHF)
    iterative   build-taskset → preference-round ×R, resumed from the store   (MADPO-iter, MARLHF-iter)
"""

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from coopflow.artifacts import ArtifactRef, ArtifactStore
from coopflow.flows.tracking import Tracker, public_params, tracker_for
from coopflow.schemas.config import ConfigError, RunConfig
from coopflow.stages.agents.checkpoint import policy_key_of
from coopflow.stages.planning import context as C
from coopflow.stages.loops import run as R
from coopflow.stages.planning import keys as K
from coopflow.stages.planning.keys import eval_key
from coopflow.stages.loops.segment import SegmentResult, settle_quietly, train_segment
from coopflow.stages.tasks.taskset import build_taskset

STAGES = ("taskset", "train", "evaluate", "score", "critic")
"""Stages a training run can be limited to with `stages=[...]`; 'score' re-scores stored rollouts."""
PREFERENCE_STAGES = ("taskset", "train", "evaluate")
PREFERENCE = ("madpo", "marlhf")
ITERATIVE = ("madpo-iter", "marlhf-iter")


# --- steps: the stage functions a runner runs ------------------------------------------------------


def _one_code_state(fn):
    """Run a pipeline with every key computed against one state of the code (`code_identity.planning`): the code a
    run's plan named is the code it runs, each closure is checked against its files once (not at every update),
    and an edit made while the run goes on is seen by the next run, not half-way through this one."""
    import functools

    from coopflow.stages.common.code_identity import planning

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with planning():
            return fn(*args, **kwargs)

    return wrapper


def build_taskset_step(cfg: RunConfig, store: ArtifactStore) -> ArtifactRef:
    """Build or reuse the taskset artifact."""
    return build_taskset(cfg.taskset, store)


def train_segment_step(ctx: C.RunContext, index: int, start: ArtifactRef | None, start_key: str,
                       show_progress: bool) -> SegmentResult:
    """Train one segment, or return its stored checkpoint/steps/metrics when already done."""
    return train_segment(ctx, index, start, start_key, show_progress=show_progress)


def evaluate_step(ctx: C.RunContext, ckpt: ArtifactRef | str, refresh: bool) -> tuple[ArtifactRef, dict]:
    """Single-path evaluation of a checkpoint (its ref or key) on the eval split (`refresh`: drop a stored one
    first)."""
    if refresh:
        ctx.store.remove("eval", eval_key(ctx, policy_key_of(ckpt)))
    return R.evaluate_checkpoint(ctx, ckpt)


def candidates_step(ctx: C.RunContext) -> tuple[ArtifactRef, ArtifactRef]:
    """P aligned joint candidates per item, scored with the task reward."""
    from coopflow.stages.loops import preference as P

    return P.generate_candidates(ctx)


def pairs_step(ctx: C.RunContext, cand: ArtifactRef, scores: ArtifactRef) -> ArtifactRef:
    """Preference pairs (ties dropped, selected by pair_selection)."""
    from coopflow.stages.loops import preference as P

    return P.make_pairs(ctx, cand, scores)


def dpo_step(ctx: C.RunContext, pairs: ArtifactRef, show_progress: bool) -> dict:
    """Joint-factorized DPO over the pairs -> checkpoint, metrics."""
    from coopflow.stages.loops import preference as P

    return P.train_dpo(ctx, pairs, show_progress)


def reward_model_step(ctx: C.RunContext, pairs: ArtifactRef) -> tuple[ArtifactRef, dict]:
    """Bradley-Terry joint reward model on the pairs."""
    from coopflow.stages.loops import preference as P

    return P.fit_rm(ctx, pairs)


def round_step(ctx: C.RunContext, r: int, show_progress: bool = False) -> dict:
    """One round: target + comparator candidates, aligned pairs (a replay shard), replay, training, eval."""
    from coopflow.stages.loops import rounds as I

    return I.run_round(ctx, r, show_progress)


def prepare_agents_step(cfg: RunConfig, store: ArtifactStore) -> tuple[list[str], dict]:
    """Resolve the agent sources (building the tiny model or installing a catalog model when asked)."""
    return C.resolve_sources(cfg, store)


def evaluate_before_step(ctx: C.RunContext) -> tuple[ArtifactRef, dict]:
    """The initial policies on the final evaluation's items and seed (the 'before' of before/after)."""
    return R.evaluate_initial(ctx)


def fit_critic_step(ctx: C.RunContext, ckpt: ArtifactRef, steps_refs: list[ArtifactRef]) -> tuple[ArtifactRef, dict]:
    """Re-fit the trained critic(s) on the run's stored actor-critic samples (no generation)."""
    return R.refit_critic(ctx, ckpt, steps_refs)


def rescore_step(ctx: C.RunContext, steps_refs: list[ArtifactRef]) -> list[dict]:
    """Re-score stored rollouts with the configured reward; per-update metric rows."""
    return R.rescore(ctx, steps_refs)


STEPS: dict[str, Callable] = {
    "build-taskset": build_taskset_step, "prepare-agents": prepare_agents_step, "train-segment": train_segment_step,
    "evaluate": evaluate_step, "evaluate-before": evaluate_before_step, "fit-critic": fit_critic_step,
    "rescore": rescore_step, "generate-candidates": candidates_step, "build-pairs": pairs_step, "dpo-update": dpo_step,
    "fit-reward-model": reward_model_step, "preference-round": round_step}
"""Every step of every pipeline by name (a Prefect runner's tasks carry the same names)."""


# --- runners ---------------------------------------------------------------------------------------


@dataclass
class Runner:
    """How a run's steps run (`runner(step, *args)`) and how its entry point marks the run."""

    steps: Mapping[str, Callable]  # step name -> a callable taking the step's arguments
    logger: Any  # a logging.Logger (or Prefect's run logger)
    tags: dict[str, str] = field(default_factory=dict)  # MLflow tags of the entry point
    label: str | None = None  # default MLflow run name `<algorithm>-<label>` (None: the run's key)
    session: Any = None  # live agents a run starts from (stages.planning.session.Session), trained in place
    sets_threads: bool = True  # owns its process: sets its torch threads (else only when agents.torch_threads
    # says) and keeps its freed memory for reuse (stages.common.memory)

    def __call__(self, step: str, *args):
        return self.steps[step](*args)


def inline_runner(tags: dict[str, str] | None = None, label: str | None = None, session=None) -> Runner:
    """Steps called in this process, no Prefect server (the Python API: the user's process keeps its torch
    threads unless the config sets agents.torch_threads)."""
    return Runner(STEPS, logging.getLogger("coopflow.run"), dict(tags or {}), label, session, sets_threads=False)


def run_inline(cfg: RunConfig, show_progress: bool = False, session=None, continue_run: str | None = None,
               tracking: bool = False, tags: dict[str, str] | None = None, label: str | None = None) -> dict:
    """`run` with the inline runner: every step in this process, no Prefect server (tests, benchmarks, scripts).
    `tracking=False` (the default here) runs without MLflow whatever the config says (tracking changes no key)."""
    if not tracking and cfg.tracking.enabled:
        cfg = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"enabled": False})})
    return run(cfg, inline_runner(tags, label, session), show_progress=show_progress, continue_run=continue_run)


def run(cfg: RunConfig, runner: Runner, show_progress: bool = False, continue_run: str | None = None) -> dict:
    """Run a config's algorithm end to end with its default stages (the Python API's entry)."""
    if cfg.algorithm in ITERATIVE:
        if continue_run:
            raise ConfigError(f"{cfg.algorithm} resumes its rounds from the store: it takes no continue_run")
        return iterative(cfg, runner, show_progress=show_progress)
    if cfg.algorithm in PREFERENCE:
        if continue_run:
            raise ConfigError(f"{cfg.algorithm} does not take continue_run (its stages are cached by key: rerunning "
                              "the same config reuses them)")
        return preference(cfg, runner, show_progress=show_progress)
    return train(cfg, runner, show_progress=show_progress, continue_run=continue_run)


@_one_code_state
def evaluate_policies(cfg: RunConfig, runner: Runner, policies, num_items: int | None, seed_name: str) -> dict:
    """Evaluate live policies (the Python API's `trainer.evaluate()`) on the config's eval items (the first
    `num_items`; all when None), after the same pre-flight and with the same context as a run; nothing stored."""
    from coopflow.stages.common.seeds import derive_seed
    from coopflow.stages.evaluate.evaluate import evaluate

    store = open_store(cfg, runner)
    ctx = C.make_context(cfg, store, runner("build-taskset", cfg, store), session=runner.session)
    try:
        caller, proc, _ = ctx.eval_reward()
        items = ctx.eval_items[:num_items] if num_items else ctx.eval_items
        _, metrics = evaluate(policies, items, C.formatters_for(ctx, policies, ctx.settings.eval), ctx.eval_sampling,
                              caller, proc,
                              derive_seed(cfg.seed, seed_name), ctx.episode, ctx.eval_hooks)
    finally:
        ctx.session.close()
    return metrics


# --- train (MAGRPO family, actor-critic) -----------------------------------------------------------


@_one_code_state
def train(cfg: RunConfig, runner: Runner, stages: list[str] | None = None, refresh: list[str] | None = None,
          rescore_from: str | None = None, show_progress: bool = False, continue_run: str | None = None) -> dict:
    """Chain the training stages under the run-key lock, tracked in MLflow; returns the run summary.

    `continue_run` (an MLflow run id) continues an earlier, shorter run of the same config (e.g. 1 epoch,
    now 3): its segments are reused and the new ones log into that same MLflow run, env_step continuing."""
    stages, refresh = _training_stages(stages, refresh, rescore_from)
    store = open_store(cfg, runner)
    taskset = runner("build-taskset", cfg, store)
    sources, ident = runner("prepare-agents", cfg, store)
    ctx = C.make_context(cfg, store, taskset, sources, ident, session=runner.session)
    with keyed_run(cfg, ctx, runner, continue_run) as log:
        if cfg.eval_before and "train" in stages and "evaluate" in stages:
            log.evaluated(*runner("evaluate-before", ctx), before=True)
        trained = None
        if "train" in stages:
            trained = R.run_segments(ctx, lambda c, i, start, key: runner("train-segment", c, i, start, key,
                                                                           show_progress), log.segment)
        elif "evaluate" in stages or "critic" in stages:
            trained = R.stored_training(ctx)
        evaluated = None
        if "evaluate" in stages:  # (by key: the final checkpoint may still be being written while it evaluates)
            evaluated = runner("evaluate", ctx, trained.checkpoint_key, "evaluate" in refresh)
        if trained:
            log.trained(trained)
        if evaluated:
            log.evaluated(*evaluated)
        if "critic" in stages:
            log.critic(*runner("fit-critic", ctx, trained.checkpoint, trained.steps_refs))
        if "score" in stages:
            steps = [store.find("steps", k) for k in R.segment_keys_of(store, rescore_from)]
            log.rescored(runner("rescore", ctx, steps), rescore_from)
        return log.finish()


def _training_stages(stages, refresh, rescore_from) -> tuple[list[str], list[str]]:
    stages = list(stages or ["taskset", "train", "evaluate"])
    refresh = list(refresh or [])
    bad = [s for s in stages + refresh if s not in STAGES]
    if bad:
        raise ConfigError(f"unknown stage(s) {bad}; choose from {list(STAGES)}")
    if "score" in stages and not rescore_from:
        raise ConfigError("stages=['score'] re-scores the rollouts of an earlier run: pass rescore_from=<run_key>")
    if "train" in stages and "train" in refresh:
        raise ConfigError("refresh=['train'] is not supported: training artifacts are input-addressed and never "
                          "stale; change the seed or config to train anew")
    return stages, refresh


def open_store(cfg: RunConfig, runner: Runner) -> ArtifactStore:
    """The run's store (temp dirs of killed writers cleared), after the pre-flight (`stages.operations.preflight`:
    the data dir, the user code the config names, sandbox isolation when required, the taskset's rows, the disk;
    PreflightError with one line naming what is wrong, before any model loads) and setting this process's torch
    threads (and, in a process the run owns, its malloc: `keep_freed_memory`). Every entry point opens its run's
    store here, so every one gets the same refusals."""
    from coopflow.stages.operations.preflight import preflight

    preflight(cfg)
    if runner.sets_threads or cfg.agents.torch_threads:
        from coopflow.stages.common.threads import apply_threads

        runner.logger.info("torch threads: %d (%s)", *apply_threads(cfg.agents.torch_threads))
    if runner.sets_threads:  # a process the run owns (not a Python API user's): its freed memory kept for reuse
        from coopflow.stages.common.memory import keep_freed_memory

        runner.logger.info("freed memory: %s", keep_freed_memory())
    store = ArtifactStore.of(cfg)
    store.clean_temp()
    return store


@contextmanager
def keyed_run(cfg: RunConfig, ctx: C.RunContext, runner: Runner,
              continue_run: str | None = None) -> Iterator["RunLog"]:
    """The MLflow run of a run key, under the run-key lock: a run that waited for an identical one reuses that
    one's MLflow run, a killed process's run is continued (older killed ones closed), `continue_run` is checked
    and continued. On exit the run's session closes, MLflow finishes (FAILED on an error), the lock is released
    (also by the process's death)."""
    run_key = ctx.run_key
    tracker = tracker_for(cfg)
    t_wait = int(time.time() * 1000)
    with ctx.store.lock(f"run-{run_key}", [ctx.plan.start_key, *ctx.end_keys]) as waited, _closing(ctx, tracker):
        resumed = tracker.finished_run(run_key, t_wait) if waited and not continue_run else None
        if resumed:
            runner.logger.info("%s: an identical run finished while this one waited; reusing its artifacts and "
                               "MLflow run %s", cfg.algorithm, resumed)
        if continue_run:
            _check_continuation(tracker, continue_run, list(ctx.end_keys))
        elif not resumed:
            resumed = _take_over_killed(tracker, run_key)
        tracker.record("taskset", ctx.taskset, tag=True)  # (a new run gets its queued tags with its params)
        tags = {"coopflow.run_key": run_key, **runner.tags}
        log = RunLog.start(cfg, ctx, runner, tracker, run_key, tags, run_id=continue_run or resumed)
        if continue_run or resumed:
            tracker.tag(tags)
        if resumed and not waited:
            tracker.tag({"coopflow.resumed_after_kill": "true"})
            runner.logger.info("%s: continuing MLflow run %s, whose process was killed", cfg.algorithm, resumed)
        log.continued = bool(continue_run or resumed)
        log.summary["run_key"] = run_key
        log.summary["warnings"] = list(ctx.plan.warnings)
        tracker.log_dataset(f"taskset-{cfg.taskset.name}", ctx.taskset)
        tracker.flush()
        yield log


@contextmanager
def _closing(ctx: C.RunContext, tracker: Tracker) -> Iterator[None]:
    """Close the run's session and finish its MLflow run (FAILED when the body raised)."""
    ok = False
    try:
        yield
        ctx.store.settle()  # a checkpoint still being written is committed before the run counts as finished
        ok = True
    finally:
        if not ok:
            settle_quietly(ctx)
        ctx.session.close()
        tracker.finish(ok)


def _take_over_killed(tracker: Tracker, run_key: str) -> str | None:
    """The newest MLflow run of this key whose process was killed (to continue); older such runs are closed."""
    dead = tracker.dead_runs(run_key)
    for rid in dead[:-1]:
        tracker.mark_killed(rid)
    return dead[-1] if dead else None


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


# --- the run's MLflow record and summary -----------------------------------------------------------


class RunLog:
    """What a run tells MLflow and its caller: one method per event, each logging it and noting it in the
    summary the run returns."""

    def __init__(self, cfg: RunConfig, ctx: C.RunContext, runner: Runner, tracker: Tracker, summary: dict):
        self.cfg, self.ctx, self.store, self.runner, self.tracker = cfg, ctx, ctx.store, runner, tracker
        self.summary = summary
        self.env_steps = 0  # where evaluations are logged: the trained policy's env_step
        self.continued = False  # the MLflow run already holds the metrics of stored segments

    @classmethod
    def start(cls, cfg: RunConfig, ctx: C.RunContext, runner: Runner, tracker: Tracker, key: str,
              tags: dict[str, str], run_id: str | None = None) -> "RunLog":
        """Create (or reopen `run_id`) the run's MLflow run, named by the config, else `<algorithm>-<label or
        key>`, with the config (secrets masked) as params."""
        name = cfg.tracking.run_name or f"{cfg.algorithm}-{runner.label or key[:8]}"
        run_id = tracker.start(name, {"coopflow.algorithm": cfg.algorithm, **tags}, public_params(cfg), run_id=run_id)
        runner.logger.info("%s: %s in %d segment(s), key %s, mlflow run %s", cfg.algorithm, ctx.plan.budget.describe(),
                           len(ctx.plan.segments), key, run_id)
        for w in ctx.plan.warnings:
            runner.logger.warning(w)
        return cls(cfg, ctx, runner, tracker, {"algorithm": cfg.algorithm, "mlflow_run_id": run_id,
                                          "budget": ctx.plan.budget.as_dict()})

    def artifacts(self, tag: bool = True, **refs: ArtifactRef) -> None:
        """Artifacts of the run's lineage by role (tagged `lineage.<role>` on the run when `tag`)."""
        for role, ref in refs.items():
            self.tracker.record(role, ref, tag=tag)

    def metrics(self, rows: list[dict] | ArtifactRef, flush: bool = True) -> None:
        """Metric rows {key, value, env_step}, or a stored metrics table."""
        self.tracker.log_metrics(self.store.read_rows(rows) if isinstance(rows, ArtifactRef) else rows, flush=flush)

    def _at_env_steps(self, values: dict[str, float], prefix: str = "", step: int | None = None) -> None:
        self.metrics([{"key": prefix + k, "value": v, "env_step": self.env_steps if step is None else step}
                      for k, v in values.items()], flush=False)

    def segment(self, i: int, res: SegmentResult) -> None:
        """A trained (or stored) segment: its metrics (a continued run already has a stored one's) and checkpoint."""
        if res.cached:
            self.runner.logger.info("segment %d cached: checkpoint %s", i, res.checkpoint_key)
        if not (self.continued and res.cached):
            self.metrics(res.metrics)
            self.rollout_tables(i, res, self.ctx)

    def rollout_tables(self, i: int, res: SegmentResult, ctx: C.RunContext) -> None:
        """Segment i's joint answers as one MLflow table (`rollouts/segment_NNNN.json`) of the updates
        `tracking.rollouts` selects, and its periodic evaluations' (`rollouts/eval_update_NNNN.json`)."""
        setting = self.cfg.tracking.rollouts
        if not self.tracker.enabled or setting == "none" or res.steps is None:
            return
        from coopflow.stages.operations import rollouts as RO

        store, last, run_key = self.store, ctx.plan.updates[-1].index, ctx.run_key

        def table() -> dict:  # (on the tracker's writer thread: reading the rows back never holds the run up)
            steps = store.read_rows(res.steps)
            out = {}
            for s in steps:  # the segment's periodic evaluations (eval_interval), each before its update
                ref = store.find("eval", K.periodic_eval_key(res.metrics.key, s["update"])) if res.metrics else None
                if ref is not None:
                    out[f"rollouts/eval_update_{s['update']:04d}.json"] = RO.eval_table(
                        RO.eval_table_rows(store, ref, ""))
            keep = set(RO.logged_updates(setting, [s["update"] for s in steps], last))
            rows = [r for s in steps if s["update"] in keep for r in RO.update_rows(store, run_key, s)]
            if rows:
                out[f"rollouts/segment_{i + 1:04d}.json"] = RO.joint_table(rows)
            return out

        self.tracker.log_tables(table)

    def trained(self, trained: R.TrainResult) -> None:
        """The segments' lineage (manifests, rollouts, scores, learning signals), final checkpoint and totals."""
        self.store.settle()  # the final checkpoint, written beside the evaluation, is committed by now
        for i, seg in enumerate(trained.segments):
            self.tracker.record(f"checkpoint.segment_{i}", seg.checkpoint)
        for kind, ref in R.run_lineage(self.store, trained):
            self.tracker.record(kind, ref)
        self.tracker.record("checkpoint.final", trained.checkpoint, tag=True)
        self.summary.update(R.training_summary(self.store, trained))
        self.env_steps = trained.env_steps

    def evaluated(self, ref: ArtifactRef, ev: dict[str, float], before: bool = False) -> None:
        """An evaluation: of the trained policy (at its env_step), or `before` training (at env_step 0)."""
        if self.tracker.enabled and self.cfg.tracking.rollouts != "none":
            from coopflow.stages.operations import rollouts as RO

            store, name = self.store, f"rollouts/eval{'_before' if before else ''}.json"
            self.tracker.log_tables(lambda: {name: RO.eval_table(RO.eval_table_rows(store, ref, ""))})
        if before:
            self.tracker.record("eval_before", ref)
            self._at_env_steps({k.removeprefix("eval/"): v for k, v in ev.items()}, "eval_before/", step=0)
            self.summary["eval_before"] = ev
        else:
            self.tracker.record("eval", ref, tag=True)
            self._at_env_steps(ev)
            self.summary["eval"] = ev

    def critic(self, ref: ArtifactRef, metrics: dict[str, float]) -> None:
        """The critic(s) re-fitted on the run's stored samples."""
        self.tracker.record("critic", ref, tag=True)
        self._at_env_steps(metrics)
        self.summary["critic_refit"] = {**metrics, "artifact": str(self.store.open_dir(ref))}

    def rescored(self, rows: list[dict], source_run_key: str) -> None:
        """An earlier run's rollouts re-scored with this config's reward."""
        self.metrics(rows, flush=False)
        vals = [r["value"] for r in rows]
        self.summary["rescore"] = dict(zip(("reward_first", "reward_last"), R.first_last_fifth(vals)),
                                       updates=len(vals), source_run_key=source_run_key)

    def finish(self) -> dict:
        """The run's files (summary, config, lineage) and the `final_model_saved` mark; returns the summary."""
        self.summary["executed"] = self.ctx.session.executed()
        t, cfg = self.tracker, self.cfg
        if t.enabled:
            files: dict[str, Any] = {"summary.json": self.summary, "config.json": public_params(cfg),
                                     "lineage.json": t.lineage}
            t.log_files(files)
        self.metrics([{"key": "final_model_saved", "value": 1.0, "env_step": self.env_steps}])
        return self.summary


# --- preference learning (MADPO, MARLHF) -----------------------------------------------------------


@_one_code_state
def preference(cfg: RunConfig, runner: Runner, stages: list[str] | None = None, refresh: list[str] | None = None,
               show_progress: bool = False) -> dict:
    """MADPO / MARLHF: candidates -> pairs -> (DPO | reward model -> RL) -> evaluate, tracked in MLflow."""
    stages = list(stages or ["taskset", "train", "evaluate"])
    refresh = list(refresh or [])
    bad = [s for s in stages + refresh if s not in PREFERENCE_STAGES]
    if bad:
        raise ConfigError(f"unknown stage(s) {bad} for train-{cfg.algorithm}; choose from {list(PREFERENCE_STAGES)}")
    store = open_store(cfg, runner)
    taskset = runner("build-taskset", cfg, store)
    ctx = C.preference_context(cfg, store, taskset, runner.session)
    tracker = tracker_for(cfg)
    with _closing(ctx, tracker):
        log = RunLog.start(cfg, ctx, runner, tracker, K.pairs_key(ctx), dict(runner.tags))
        log.artifacts(taskset=taskset)
        cand, scores = runner("generate-candidates", ctx)
        pairs = runner("build-pairs", ctx, cand, scores)
        log.artifacts(rollouts=cand, scores=scores, pairs=pairs)
        log.summary.update(candidates=cand.key, pairs=pairs.key,
                           pair_count=len({r["pair_id"] for r in store.read_rows(pairs)}))
        if cfg.algorithm == "madpo":
            ckpt, eval_ctx = _dpo(ctx, runner, log, pairs, show_progress), ctx
        else:
            ckpt, eval_ctx = _rlhf(ctx, runner, log, pairs, show_progress)
        log.artifacts(**{"checkpoint.final": ckpt})
        log.summary.update(env_steps=log.env_steps, checkpoint=str(store.open_dir(ckpt)))
        if "evaluate" in stages:  # always with the task reward
            log.evaluated(*runner("evaluate", eval_ctx, ckpt, "evaluate" in refresh))
        return log.finish()


def _dpo(ctx: C.RunContext, runner: Runner, log: RunLog, pairs: ArtifactRef, show_progress: bool) -> ArtifactRef:
    """MADPO's update on the pairs; returns its checkpoint."""
    res = runner("dpo-update", ctx, pairs, show_progress)
    rows = ctx.store.read_rows(res["metrics"])
    log.metrics(rows)
    log.env_steps = max((r["env_step"] for r in rows), default=0)
    log.summary["run_key"] = res["checkpoint"].key
    if log.tracker.enabled and log.cfg.tracking.rollouts not in ("none", "eval"):  # the pairs, as one MLflow table
        from coopflow.stages.operations import rollouts as RO

        store, key, env = ctx.store, res["checkpoint"].key, log.env_steps
        log.tracker.log_tables(lambda: {"rollouts/pairs.json": RO.pairs_table(store, key, pairs.key, env)})
    return res["checkpoint"]


def _rlhf(ctx: C.RunContext, runner: Runner, log: RunLog, pairs: ArtifactRef,
          show_progress: bool) -> tuple[ArtifactRef, C.RunContext]:
    """MARLHF: a reward model on the pairs, then RL on it; returns the checkpoint and the RL phase's context."""
    from coopflow.stages.loops import preference as P

    rm_ref, rm_metrics = runner("fit-reward-model", ctx, pairs)
    log.artifacts(reward_model=rm_ref)
    log.metrics([{"key": k, "value": v, "env_step": 0} for k, v in rm_metrics.items()])
    log.summary["reward_model"] = {**rm_metrics, "artifact": str(ctx.store.open_dir(rm_ref))}
    rctx = P.rl_context(ctx, rm_ref)

    def on_segment(i: int, res: SegmentResult) -> None:
        log.metrics(res.metrics)
        log.rollout_tables(i, res, rctx)

    trained = R.run_segments(rctx, lambda c, i, start, key: runner("train-segment", c, i, start, key, show_progress),
                             on_segment)
    first, last = trained.first_last()
    log.summary.update(rm_reward_first=first, rm_reward_last=last, run_key=policy_key_of(trained.checkpoint.key))
    log.env_steps = trained.env_steps
    return trained.checkpoint, rctx


# --- iterative (online) MADPO / MARLHF -------------------------------------------------------------


@_one_code_state
def iterative(cfg: RunConfig, runner: Runner, max_new_rounds: int | None = None, show_progress: bool = False) -> dict:
    """The rounds of an iterative experiment, resumed from the store; MLflow: one parent run for the experiment
    (reopened by later runs of it) with the rounds' metrics, and a child run per round with its artifacts."""
    from coopflow.stages.loops import rounds as I

    store = open_store(cfg, runner)
    taskset = runner("build-taskset", cfg, store)
    ctx = C.make_context(cfg, store, taskset, session=runner.session)
    keys = K.round_keys(ctx)
    parent = tracker_for(cfg)
    with _closing(ctx, parent):
        run_id = _parent_run(parent, keys[0], cfg, runner)
        runner.logger.info("%s: %d of %d rounds stored; mlflow parent run %s", cfg.algorithm,
                           I.completed_rounds(ctx), len(keys), run_id)
        summary: dict[str, Any] = {"algorithm": cfg.algorithm, "mlflow_run_id": run_id, "rounds": len(keys)}
        warnings, ran = list(ctx.plan.warnings), []

        def track_round(r: int, res: dict) -> None:
            for w in res["warnings"]:
                runner.logger.warning(w)
                if w not in warnings:
                    warnings.append(w)
            _log_round(cfg, store, parent, run_id, r, res)
            ran.append(r)

        I.run_rounds(ctx, max_new_rounds, lambda c, r: runner("preference-round", c, r, show_progress), track_round,
                     show_progress)
        summary.update(completed_rounds=I.completed_rounds(ctx), ran_rounds=ran)
        if warnings:
            summary["warnings"] = warnings
        done = summary["completed_rounds"]
        last = store.find("checkpoint", keys[done - 1]) if done else None
        if last is not None:
            from coopflow.stages.agents.checkpoint import CheckpointLayout

            ckpt = store.open_dir(last)
            summary.update(checkpoint=str(ckpt), eval=I.round_eval(store, store.find("metrics", last.key)),
                           env_steps=CheckpointLayout(ckpt).trainer_state().get("env_step", 0))
        summary["executed"] = ctx.session.executed()
        return summary


def _parent_run(tracker: Tracker, exp_key: str, cfg: RunConfig, runner: Runner) -> str | None:
    """The experiment's MLflow parent run: reopened when an earlier (scheduled) run created it."""
    if not tracker.enabled:
        return None
    found = tracker.client.search_runs([tracker.experiment_id], f"tags.`coopflow.iter_experiment` = '{exp_key}'",
                                       max_results=1)
    name = cfg.tracking.run_name or f"{cfg.algorithm}-{runner.label or exp_key[:8]}"
    if found:
        run_id = tracker.start(name, {}, public_params(cfg), run_id=found[0].info.run_id)
        tracker.tag(runner.tags)
        return run_id
    return tracker.start(name, {"coopflow.iter_experiment": exp_key, "coopflow.algorithm": cfg.algorithm,
                                **runner.tags}, public_params(cfg))


def _log_round(cfg: RunConfig, store: ArtifactStore, parent: Tracker, parent_id: str | None, r: int,
               res: dict) -> None:
    """A newly run round: its metrics on the parent run, and a child run with its metrics and artifacts."""
    from coopflow.stages.evaluate.reward_drift import bar_svg

    rows = store.read_rows(res["metrics"])
    parent.log_metrics(rows)
    child = tracker_for(cfg)
    child.start(f"round-{r}", {"mlflow.parentRunId": parent_id or "", "coopflow.round": str(r)}, {})
    child.log_metrics(rows)
    for ref in res.get("rl_metrics") or []:  # MARLHF-iter: the RL phase's per-update metrics
        child.log_metrics(store.read_rows(ref))
    child.record("checkpoint", res["checkpoint"], tag=True)
    child.record("pairs", res["shard"], tag=True)
    if cfg.tracking.rollouts != "none":  # the round's pairs and evaluated answers, as MLflow tables
        from coopflow.stages.operations import rollouts as RO

        key, env = res["checkpoint"].key, max((x["env_step"] for x in rows), default=0)
        tables = {} if cfg.tracking.rollouts == "eval" else {
            "rollouts/pairs.json": RO.pairs_table(store, key, res["shard"].key, env)}
        ev = store.find("eval", key)
        if ev is not None:
            tables["rollouts/eval.json"] = RO.eval_table(RO.eval_table_rows(store, ev, key))
        child.log_tables(tables)
    if res.get("drift"):
        name = f"reward_distributions/iteration_{r:04d}"
        child.log_files({f"{name}.json": res["drift"],
                         f"{name}_candidates.html": bar_svg(res["drift"]).encode(),
                         f"{name}_selected.html": bar_svg(res["drift"], "selected").encode()})
    child.finish(True)
