"""The segment loop: every segment of an online RL run in order, and what follows training.

`run_segments` is the one loop over a run's segments. The run driver (`coopflow.flows.driver`: the Prefect
flows, the CLI, the Python API, tests and benchmarks) and MARLHF's RL phase (offline and per iterative round) use
it; the driver passes a `run_segment` that runs `train_segment` as its runner's step and an `on_segment` callback
that logs each segment's metrics. A segment whose checkpoint is stored is returned without loading a model,
so rerunning a finished run only re-reads its manifests.

After training: `evaluate_checkpoint` (single-path evaluation with the task reward), `refit_critic`
(re-fit the trained critics on the run's stored actor-critic samples, no generation) and `rescore`
(score an earlier run's stored rollouts with this config's reward, no generation or training).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from coopflow.artifacts import ArtifactError, ArtifactRef, ArtifactStore
from coopflow.artifacts.store import PendingDir
from coopflow.schemas.config import ConfigError
from coopflow.stages.agents.checkpoint import (CheckpointLayout, drop_optimizer_state, find_checkpoint, is_weights_only,
                                     policy_key_of)
from coopflow.stages.agents.models import load_critic, save_critic
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.evaluate.evaluate import eval_metrics, evaluate, hook_metrics
from coopflow.stages.fit.critic import fit_critic, predict_values
from coopflow.stages.loops import actor_critic as AC
from coopflow.stages.planning.context import RunContext, formatters_for
from coopflow.stages.planning.keys import critic_refit_key, eval_key, scores_key
from coopflow.stages.loops.segment import (SegmentResult, acquire_policies, node_means, peek_policies, score_or_load,
                                  train_segment)


# --- the segment loop ----------------------------------------------------------------------------


@dataclass
class TrainResult:
    """What a run's segments produced: refs per segment, every update's manifest row, the final checkpoint."""

    segments: list[SegmentResult] = field(default_factory=list)
    steps_rows: list[dict] = field(default_factory=list)  # the `steps` rows of every update, in order

    def add(self, store: ArtifactStore, res: SegmentResult) -> None:
        """Append one segment's result (and its stored manifest rows)."""
        self.segments.append(res)
        if res.steps is not None:
            self.steps_rows += store.read_rows(res.steps)

    @property
    def checkpoint(self) -> ArtifactRef | None:
        """The final checkpoint (waits for its write when it is still running)."""
        return self.segments[-1].checkpoint if self.segments else None

    @property
    def checkpoint_key(self) -> str | None:
        """The final checkpoint's key (never waits)."""
        return self.segments[-1].checkpoint_key if self.segments else None

    @property
    def steps_refs(self) -> list[ArtifactRef]:
        return [s.steps for s in self.segments if s.steps is not None]

    @property
    def metrics_refs(self) -> list[ArtifactRef]:
        return [s.metrics for s in self.segments if s.metrics is not None]

    @property
    def rewards(self) -> list[float]:
        """reward_mean of every update, in order."""
        return [r["reward_mean"] for r in self.steps_rows]

    @property
    def env_steps(self) -> int:
        return self.steps_rows[-1]["env_step"] if self.steps_rows else 0

    def first_last(self) -> tuple[float | None, float | None]:
        return first_last_fifth(self.rewards)


SegmentRunner = Callable[[RunContext, int, "ArtifactRef | None", str], SegmentResult]


def run_segments(ctx: RunContext, run_segment: SegmentRunner | None = None,
                 on_segment: Callable[[int, SegmentResult], None] | None = None,
                 show_progress: bool = False) -> TrainResult:
    """Train (or reuse) every segment of the plan in order; `run_segment(ctx, i, start, start_key)`
    defaults to `train_segment`, `on_segment(i, result)` is called after each."""
    def default(c, i, start, start_key):
        return train_segment(c, i, start, start_key, show_progress=show_progress)

    run_segment = run_segment or default
    ctx.session.rebuild |= segments_to_rebuild(ctx)
    keep = ctx.settings.execution.checkpoint_optimizer
    out, ckpt, key = TrainResult(), None, ctx.plan.start_key
    for i, end in enumerate(ctx.end_keys):
        res = run_segment(ctx, i, ckpt, key)
        if policy_key_of(res.checkpoint_key) != end:
            raise RuntimeError(f"segment {i} produced policy {res.checkpoint_key}, planned {end}")
        if keep != "all" and i > 0:  # once segment i's checkpoint is committed, i-1's optimizer state is not needed
            _after_commit(res, lambda _, prev=out.segments[i - 1], k=ctx.end_keys[i - 1]:
                          setattr(prev, "checkpoint", drop_optimizer_state(ctx.store, k)))
        # (a checkpoint still being written: the next segment continues from the live policies, or finds it)
        ckpt, key = res.committed, end
        out.add(ctx.store, res)
        if on_segment is not None:
            on_segment(i, res)
    if keep == "none" and out.segments:
        out.segments[-1].checkpoint = drop_optimizer_state(ctx.store, ctx.end_keys[-1])
    return out


def _after_commit(res: SegmentResult, fn: Callable[[ArtifactRef], None]) -> None:
    """Run `fn(ref)` once segment `res`'s checkpoint is committed (now when it already is)."""
    if isinstance(res.written, PendingDir):
        res.written.after(fn)
    else:
        fn(res.written)


def segments_to_rebuild(ctx: RunContext) -> set[int]:
    """Segments to re-run although stored: when the first segment that must train starts from a weights-only
    checkpoint (its optimizer state was dropped, `checkpoint_optimizer` or `coopflow gc`), the segments after the
    last checkpoint that still has it are replayed from their stored rollouts, so training continues exactly."""
    store, ends = ctx.store, ctx.end_keys
    p = ctx.plan
    stored = [find_checkpoint(store, k) is not None and store.find("steps", sk) is not None
              and store.find("metrics", mk) is not None for k, sk, mk in zip(ends, p.steps_keys, p.metrics_keys)]
    first = next((i for i, ok in enumerate(stored) if not ok), None)
    if not first or ctx.session.live.peek(ends[first - 1]) is not None:
        return set()  # nothing to train, training starts from the sources, or from live policies
    start = first - 1
    while start >= 0 and is_weights_only(find_checkpoint(store, ends[start])):
        start -= 1  # back to a full checkpoint (or the sources)
    return set(range(start + 1, first))


def stored_training(ctx: RunContext) -> TrainResult:
    """The stored segments of an already trained run (to evaluate or re-fit without training again)."""
    store = ctx.store
    if find_checkpoint(store, ctx.run_key) is None:
        raise ConfigError("no trained checkpoint for this config yet: run the 'train' stage first")
    out = TrainResult()
    for k, sk, mk in zip(ctx.end_keys, ctx.plan.steps_keys, ctx.plan.metrics_keys):
        out.add(store, SegmentResult(find_checkpoint(store, k), store.find("steps", sk), store.find("metrics", mk),
                                     cached=True))
    return out


def run_lineage(store: ArtifactStore, trained: TrainResult) -> list[tuple[str, ArtifactRef]]:
    """(kind, ref) of every segment's `steps` manifest and of every artifact its updates read or wrote:
    rollouts, scores and the learning signal (advantages, ac_samples or pairs)."""
    out = [("steps", ref) for ref in trained.steps_refs]
    for r in trained.steps_rows:
        for kind, key in (("rollouts", r["rollouts"]), ("scores", r["scores"]), (r["signal_kind"], r["signal"])):
            found = store.find(kind, key) if key else None
            if found is not None:
                out.append((kind, found))
    return out


def training_summary(store: ArtifactStore, trained: TrainResult) -> dict:
    """The training part of a run summary: env_steps, reward first/last fifth, seconds, checkpoint. Training ends
    when the final checkpoint is committed: a final checkpoint written beside the evaluation counts its time from
    the last segment's end to its commit (the evaluation meanwhile is slower by whatever the write takes from it)."""
    t = timing_totals(store, trained.metrics_refs)
    tail = trained.segments[-1].write_seconds if trained.segments else 0.0
    if tail:
        t["checkpoint_s"] = t.get("checkpoint_s", 0.0) + tail
        t["train_s"] = t.get("train_s", 0.0) + tail
    train_s, load_s = t.get("train_s", 0.0), t.get("load_s", 0.0)
    first, last = trained.first_last()
    env = trained.env_steps
    return {"env_steps": env, "reward_first": first, "reward_last": last, "train_seconds": train_s,
            "load_seconds": load_s, "env_steps_per_s": (env / train_s) if train_s > 0 else None,
            "seconds": {k.removesuffix("_s"): round(v, 3) for k, v in sorted(t.items())
                        if k in ("generate_s", "reward_s", "score_s", "update_s", "checkpoint_s", "checkpoint_wait_s",
                                 "eval_s")},
            # (named, not read: hashing its files here cost ~40 ms per run; whoever loads it verifies it)
            "checkpoint": str(store.open_dir(trained.checkpoint, verify=False)),
            "segments_cached": [s.cached for s in trained.segments]}


def segment_keys_of(store: ArtifactStore, run_key: str) -> list[str]:
    """The keys of the `steps` manifests of every segment of an earlier run, from its final checkpoint's trainer
    state (older checkpoints stored them under the segments' end keys)."""
    ck = find_checkpoint(store, run_key)
    if ck is None:
        raise ConfigError(f"rescore_from={run_key!r}: no such run (no checkpoint with that run_key in {store.root})")
    state = CheckpointLayout(store.open_dir(ck)).trainer_state()
    return state.get("segment_steps") or state.get("segment_keys", [run_key])


# --- after training ------------------------------------------------------------------------------


def refit_critic(ctx: RunContext, ckpt: ArtifactRef, steps_refs: list[ArtifactRef]) -> tuple[ArtifactRef, dict]:
    """Re-fit the trained critic(s) of `ckpt` on the run's stored samples (rollouts + ac_samples), no
    generation: a `critic` artifact (agent_i/ for IAC, critic/ for MAAC) and the value loss before/after."""
    cs, store = ctx.settings.critic, ctx.store  # the re-fit's settings: its key holds the policy chain's and its own
    t = cs.trainer
    if not ctx.settings.actor_critic or (cs.algorithm == "iac" and not t.use_separate_critic):
        raise ValueError("the 'critic' stage re-fits separate critics: it needs train-iac with use_separate_critic "
                         "(a shared value head trains with its actor) or train-maac")
    samples, ac_keys = [], []
    for ref in steps_refs:
        for step in store.read_rows(ref):
            rows, ac = store.find("rollouts", step["rollouts"]), store.find(step["signal_kind"], step["signal"])
            if rows is None or ac is None:
                raise ArtifactError(f"stored samples of update {step['update']} not found; cannot re-fit the critic")
            samples += AC.join_samples(ctx, store.read_rows(rows), store.read_rows(ac))
            ac_keys.append(step["signal"])
    c = cs.critic
    lr = c.refit_learning_rate or t.critic_lr
    key = critic_refit_key(ctx, policy_key_of(ckpt.key), ac_keys)
    lay = CheckpointLayout(store.open_dir(ckpt))
    if cs.algorithm == "maac":
        jobs = [("critic", lay.central_critic, samples)]
    else:  # the re-fit artifact holds agent_i/ per agent (each that agent's critic)
        jobs = [(lay.agent(i).name, lay.agent_critic(i), [s for s in samples if s["agent"] == i])
                for i in range(ctx.n)]
    a = cs.agents
    crits = [(name, load_critic(src, lr, None, a.dtype, a.attn_implementation, a.device), mine)
             for name, src, mine in jobs]

    def mse(crit, mine) -> float:
        v = predict_values(crit, mine, t.critic_type)
        return sum((s["value_target"] - x) ** 2 for s, x in zip(mine, v)) / max(1, len(mine))

    metrics = {"critic_refit/value_loss_before": sum(mse(cr, m) for _, cr, m in crits) / len(crits)}
    found = store.find("critic", key)
    if found is None:
        for _, crit, mine in crits:
            fit_critic(crit, mine, t.critic_type, t.batch_size, c.refit_epochs, 1.0, cs.seed)
        found = store.put_dir("critic", key, lambda d: [save_critic(crit, d / name) for name, crit, _ in crits])
        ctx.session.calls["fit_critic"] += 1
    else:
        crits = [(name, load_critic(store.open_dir(found) / name, lr, None, a.dtype, a.attn_implementation, a.device),
                  mine) for name, _, mine in crits]
    metrics["critic_refit/value_loss_after"] = sum(mse(cr, m) for _, cr, m in crits) / len(crits)
    return found, metrics


def rescore(ctx: RunContext, steps_refs: list[ArtifactRef]) -> list[dict]:
    """Re-score the stored rollouts of an earlier run (its `steps` manifests) with this run's reward.

    No generation and no training: per update, a new scores artifact (cached by key) and a
    `rescore/turn_1/reward_mean` metric row at the update's env_step.
    """
    store = ctx.store
    by_id = {it["_item_id"]: it for it in ctx.train_items}
    out = []
    for ref in steps_refs:
        for step in store.read_rows(ref):
            found = store.find("rollouts", step["rollouts"])
            if found is None:
                raise ArtifactError(f"stored rollouts of update {step['update']} ({step['rollouts']}) not found; "
                                    "cannot re-score")
            rows = store.read_rows(found)
            base = step["env_step"] - len({(r["turn"], r["node_id"]) for r in rows}) * ctx.joint_actions_per_node
            _, scores = score_or_load(ctx, rows, by_id, scores_key(ctx, step["rollouts"], base), base)
            means = node_means(scores)
            out.append({"key": "rescore/turn_1/reward_mean", "value": sum(means) / len(means),
                        "env_step": step["env_step"]})
    return out


def timing_totals(store: ArtifactStore, metrics_refs: list[ArtifactRef]) -> dict[str, float]:
    """Every `timing/<k>_s` summed over the segments' stored metrics, as {k_s: seconds}."""
    out: dict[str, float] = {}
    for ref in metrics_refs:
        for r in store.read_rows(ref):
            k = r["key"].removeprefix("timing/")
            if k != r["key"] and k.endswith("_s"):
                out[k] = out.get(k, 0.0) + r["value"]
    return out


def train_seconds(store: ArtifactStore, metrics_refs: list[ArtifactRef]) -> tuple[float, float]:
    """(training seconds without model loading, model loading seconds) summed over segments' stored metrics."""
    t = timing_totals(store, metrics_refs)
    return t.get("train_s", 0.0), t.get("load_s", 0.0)


def first_last_fifth(values: list[float]) -> tuple[float | None, float | None]:
    """Mean of the first and last fifth of a series (at least one value each)."""
    if not values:
        return None, None
    k = max(1, math.floor(len(values) / 5))
    return sum(values[:k]) / k, sum(values[-k:]) / k


def evaluate_checkpoint(ctx: RunContext, ckpt: ArtifactRef | str) -> tuple[ArtifactRef, dict[str, float]]:
    """Evaluate a checkpoint (its ref, or its key: the live policies when they are that checkpoint, else the stored
    one, waited for when it is still being written) on the eval split (eval_num_samples items; all when 0) -> eval
    artifact + metrics."""
    return _evaluate(ctx, policy_key_of(ckpt), lambda: peek_policies(ctx, ckpt))


def evaluate_initial(ctx: RunContext) -> tuple[ArtifactRef, dict[str, float]]:
    """The policies training starts from, on the same eval items and eval seed as the final evaluation: the
    'before' of a run's before/after (left live, so training starts from them without loading them again)."""
    def initial():
        pol = acquire_policies(ctx, None, ctx.plan.start_key)
        ctx.session.live.put(ctx.plan.start_key, pol)
        return pol

    return _evaluate(ctx, ctx.plan.start_key, initial)


def _evaluate(ctx: RunContext, policy_key: str, policies) -> tuple[ArtifactRef, dict[str, float]]:
    items = ctx.eval_items_used()
    key = eval_key(ctx, policy_key)
    found = ctx.store.find("eval", key)
    if found is not None:
        rows = ctx.store.read_rows(found)
        metrics = eval_metrics(rows)
        if ctx.eval_hooks:  # hook metrics are computed from the stored rows, not stored themselves
            metrics.update(hook_metrics(rows, items, ctx.n, ctx.episode.num_turns, *ctx.eval_hooks))
        return found, metrics
    pol = policies()
    ecaller, eproc, _ = ctx.eval_reward()
    s = ctx.settings.eval
    rows, metrics = evaluate(pol, items, formatters_for(ctx, pol, s), ctx.eval_sampling, ecaller, eproc,
                             derive_seed(s.seed, "final-eval"), ctx.episode, ctx.eval_hooks,
                             samples=s.trainer.eval_samples_per_item)
    ctx.session.calls["evaluate"] += 1
    # (the checkpoint it evaluated is recorded with it: `coopflow show --eval` finds a run's evaluation by it)
    return ctx.store.put_table("eval", key, rows, meta={"checkpoint": policy_key}), metrics
