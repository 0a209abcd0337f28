"""One training segment of online RL: the update loop that chains the stages, then a checkpoint.

MAGRPO in plain words: every agent samples K answers to the same task; the K joint answers are
scored with one shared reward; each agent's answer is reinforced by how much better its joint
answer scored than the group's baseline (mean, none, max or leave-one-out), and every agent takes
one policy-gradient step on its own answers. IAC/MAAC replace the group baseline by a critic's
value (see `stages.loops.actor_critic`). One update per `rollout_buffer_size` node samples:

    generate (tree, depth by depth) + score → advantages | ac_samples → update policies

Each stage writes its Parquet artifact under the chained keys of `stages.planning.keys`. A **segment**
is a run of updates ending in a checkpoint (`checkpoint_every` updates, default one epoch).
Resuming a killed run reloads the segment's start checkpoint and *replays* the updates whose
rollouts are already stored (no generation), so no completed step is lost; a fully stored segment
returns its refs without loading a model.
"""

import logging
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass

from coopflow.artifacts import ArtifactError, ArtifactRef
from coopflow.artifacts.store import PendingDir
from coopflow.stages.agents.checkpoint import CheckpointLayout, find_checkpoint, is_weights_only, policy_key_of
from coopflow.stages.agents.models import begin_checkpoint, load_critic, load_policies, save_checkpoint
from coopflow.stages.agents.spec import specs_for
from coopflow.stages.agents.state import set_compute_dtype
from coopflow.stages.agents.workers import WorkerPolicies, agent_devices
from coopflow.stages.common.progress import bar_safe_logging
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.common.user_code import load_callable
from coopflow.stages.evaluate.evaluate import evaluate
from coopflow.stages.loops import actor_critic as AC
from coopflow.stages.planning.context import RunContext, formatters_for
from coopflow.stages.planning.plan import Update
from coopflow.stages.planning.keys import UpdateKeys, periodic_eval_key, scores_key, update_keys
from coopflow.stages.rollout.tree import generate_tree
from coopflow.stages.score.advantages import (advantage_stats, agent_reward, compute_advantages, joint_returns,
                                              local_reward_means, tree_children)
from coopflow.stages.tasks.centralized import parse_failures, split_roles
from coopflow.stages.update.policy_gradient import Objective, update_policies

log = logging.getLogger(__name__)


def score_or_load(ctx: RunContext, rows: list[dict], by_id: dict[int, dict], key: str,
                  env_step_base: int) -> tuple[ArtifactRef, list[dict]]:
    """The scores artifact `key`: read it when stored, else score the rollout rows and store them."""
    ref = ctx.store.find("scores", key)
    if ref is not None:
        return ref, ctx.store.read_rows(ref)
    scores = ctx.episode.score(rows, by_id, ctx.caller, ctx.processor, env_step_base)
    ctx.session.calls["score"] += 1
    return ctx.store.put_table("scores", key, scores), scores


# --- policies at a segment boundary --------------------------------------------------------------


def _open_policies(ctx: RunContext, sources: list, optimizer_files: list | None, state: dict,
                   checkpoint: CheckpointLayout | None = None, settings=None):
    """In-process Policies, one worker process per agent ('mp') or one Ray actor per agent ('ray').

    `checkpoint`: the checkpoint the sources come from (its critics and optimizer states are loaded too);
    `settings`: the settings of the stage that trains them (default: online RL's policy update).
    """
    s, ex = settings or ctx.settings.policy, ctx.settings.execution  # the policies' settings; where they run
    a, t, xt = s.agents, s.trainer, ex.trainer
    devices = agent_devices(xt.agent_devices, ctx.n, a.device)
    if xt.parallel_training == "ray" and xt.agent_devices is None:  # an actor that reserves a GPU uses it (Ray sets
        gpus = ex.ray.per_agent("num_gpus_per_agent", ctx.n)  # its CUDA_VISIBLE_DEVICES)
        devices = ["cuda" if g > 0 else d for g, d in zip(gpus, devices)]
    # The frozen references are always the *initial* agent sources (also when resuming a checkpoint).
    refs = list(ctx.sources) if t.held("reference_kl_enabled", False) else None
    rdev = agent_devices(xt.reference_devices, ctx.n, devices[0]) if xt.reference_devices else devices
    specs = [s.with_(reference_device=rdev[i]) for i, s in enumerate(
        specs_for(sources, t.agent_learning_rate, a.dtype, a.attn_implementation, devices, optimizer_files, refs))]
    critics = ctx.critic_paths
    if checkpoint is not None and s.algorithm == "iac" and critics:
        critics = [str(checkpoint.agent_critic(i)) for i in range(ctx.n)]
    specs = AC.agent_specs(s, ex, specs, critics, checkpoint)
    if a.lora is not None:  # agent i: adapter i on the base (in-process: one shared copy; workers/actors: their own)
        from coopflow.stages.agents.lora import load_lora_policies, lora_specs

        specs = lora_specs(specs, ctx.sources[0], a.lora, s.seed)
    if a.lora is not None and xt.parallel_training == "none":
        pol = load_lora_policies(specs)
    elif xt.parallel_training == "mp":
        pol = WorkerPolicies(specs)
    elif xt.parallel_training == "ray":
        from coopflow.stages.agents.ray_actors import RayPolicies

        pol = RayPolicies(specs, ex.ray)
    else:
        pol = load_policies(specs)
    ctx.session.own(pol)  # stopped when the run ends, whichever way it ends
    pol.run(set_compute_dtype, [(ctx.sampling.compute_dtype,)] * pol.n)
    if s.algorithm == "maac":
        src = str(checkpoint.central_critic) if checkpoint is not None else ctx.critic_paths[0]
        cdev = agent_devices(xt.critic_devices, 1, devices[0])[0]
        pol.critic = load_critic(src, t.critic_lr, t.critic_value_head_hidden_dim, a.dtype, a.attn_implementation, cdev,
                                 checkpoint.central_critic_optimizer if checkpoint is not None else None,
                                 pol.tokenizers[0], derive_seed(s.seed, "central_critic_head"))
    pol.state = state
    return pol


def open_checkpoint(ctx: RunContext, ckpt: ArtifactRef, with_optimizers: bool = True, settings=None):
    """Load the policies of a stored checkpoint (its optimizer states unless `with_optimizers` is False or the
    checkpoint is weights-only); `settings` as in `_open_policies`."""
    lay = CheckpointLayout(ctx.store.open_dir(ckpt))
    with_optimizers = with_optimizers and not is_weights_only(ckpt)
    dirs, opts, state = lay.sources(ctx.n)
    return _open_policies(ctx, [str(d) for d in dirs], opts if with_optimizers else None, state,
                          lay if with_optimizers else None, settings)


def acquire_policies(ctx: RunContext, start: ArtifactRef | None, start_key: str, settings=None):
    """Live policies for a segment start: in-memory when possible, else the checkpoint, else the sources;
    `settings` as in `_open_policies`.
    (`run_segments` never starts a segment that trains from a weights-only checkpoint: it rebuilds the full one.)"""
    pol = ctx.session.live.take(policy_key_of(start_key))
    if pol is not None:
        return pol
    ctx.store.settle()  # (the policies about to be closed may still be writing a checkpoint)
    ctx.session.live.clear()
    if start is None and ctx.session.initial is not None and tuple(ctx.sources) == ctx.session.initial_sources:
        # the caller's live agents, which hold the weights of exactly these sources
        pol = ctx.session.initial
        pol.state = {"update": 0, "env_step": 0, "last_logged": None}
        pol.run(set_compute_dtype, [(ctx.sampling.compute_dtype,)] * pol.n)
        return pol
    if start is None:
        return _open_policies(ctx, ctx.sources, None, {"update": 0, "env_step": 0, "last_logged": None},
                              settings=settings)
    return open_checkpoint(ctx, start, settings=settings)


def writes_behind(ctx: RunContext) -> bool:
    """Whether this run writes its checkpoints beside the next phase (`checkpoint_write`; auto: where an agent runs
    on a GPU, whose generation leaves the CPU cores free for the write; on CPUs the write takes the cores the next
    phase needs, and measured no faster end to end)."""
    mode = ctx.settings.execution.checkpoint_write
    if mode != "auto":
        return mode == "background"
    devices = agent_devices(ctx.settings.execution.trainer.agent_devices, ctx.n, ctx.settings.policy.agents.device)
    return any(str(d).startswith("cuda") for d in devices)


def settle_quietly(ctx: RunContext) -> None:
    """Commit a checkpoint still being written, on a path that is already failing: its own error is logged, not
    raised (the first error is the one to see); a checkpoint that cannot be committed is simply not stored."""
    try:
        ctx.store.settle()
    except Exception as err:  # noqa: BLE001
        log.warning("a checkpoint written in the background was not stored: %s", err)


def peek_policies(ctx: RunContext, ckpt: ArtifactRef | str):
    """Policies of a checkpoint (its ref or key) for read-only use (evaluation), reusing the live copy if it
    matches."""
    key = policy_key_of(ckpt)
    pol = ctx.session.live.peek(key)
    if pol is None:
        ref = find_checkpoint(ctx.store, key) if isinstance(ckpt, str) else ckpt
        if ref is None:
            raise ArtifactError(f"checkpoint {key} is not stored; run the 'train' stage first")
        ctx.store.settle()  # (the live policies are about to be replaced: their checkpoint write ends first)
        pol = open_checkpoint(ctx, ref)
        ctx.session.live.put(key, pol)
    return pol


# --- one segment ---------------------------------------------------------------------------------


@dataclass
class SegmentResult:
    """Refs a finished segment produced (all artifacts); `cached` when it was already stored.

    `written`: the checkpoint's ref, or its write still running beside the next phase (`PendingDir`, see
    `checkpoint_write`); `checkpoint` waits for that write (and commits it), `checkpoint_key` does not.
    `replaced`: the weights-only checkpoint that replaced it (`checkpoint_optimizer`)."""

    written: "ArtifactRef | PendingDir"
    steps: ArtifactRef
    metrics: ArtifactRef
    cached: bool = False
    replaced: ArtifactRef | None = None

    @property
    def checkpoint(self) -> ArtifactRef:
        if self.replaced is not None:
            return self.replaced
        return self.written.result() if isinstance(self.written, PendingDir) else self.written

    @checkpoint.setter
    def checkpoint(self, ref: ArtifactRef) -> None:
        self.replaced = ref

    @property
    def checkpoint_key(self) -> str:
        return self.written.key

    @property
    def committed(self) -> "ArtifactRef | None":
        """The checkpoint's ref when its write has been committed (never waits), else None."""
        if isinstance(self.written, PendingDir) and not self.written.done:
            return None
        return self.checkpoint

    @property
    def write_seconds(self) -> float:
        """How long the checkpoint took to be committed after the segment returned (0 when written before)."""
        return (self.written.seconds or 0.0) if isinstance(self.written, PendingDir) else 0.0


def turn_metrics(scores: list[dict], rollouts: list[dict], returns: dict[tuple, float],
                 kl_coef: float | None = None) -> dict[str, float]:
    """Per turn t: turn_t/reward_mean (mean of node mean rewards), turn_t/expected_return (mean of node
    mean returns), node counts, and turn_t/reference_kl_mean / _penalty_mean when reference KL is on."""
    nodes: dict[tuple, list[tuple[float, float]]] = {}
    for s in scores:
        node = (s["step"], s["turn"], s["node_id"])
        nodes.setdefault(node, []).append((s["reward"], returns[node + (s["joint_idx"],)]))
    out: dict[str, float] = {}
    for turn in sorted({n[1] for n in nodes}):
        mine = [v for n, v in nodes.items() if n[1] == turn]
        p = f"turn_{turn + 1}/"
        out[p + "reward_mean"] = sum(sum(r for r, _ in v) / len(v) for v in mine) / len(mine)
        out[p + "expected_return"] = sum(sum(R for _, R in v) / len(v) for v in mine) / len(mine)
        if len(nodes) > len(mine) or turn > 0:
            out[p + "nodes"] = float(len(mine))
        if kl_coef is not None:
            kls = [r["ref_kl"] for r in rollouts if r["turn"] == turn]
            out[p + "reference_kl_mean"] = sum(kls) / len(kls)
            out[p + "reference_kl_penalty_mean"] = kl_coef * sum(kls) / len(kls)
    return out


def domain_metrics(ctx: RunContext, rows: list[dict], scores: list[dict]) -> dict[str, float]:
    """The user's metrics_callback over this update's samples (empty without one)."""
    s = ctx.settings.metrics
    if not s.metrics_callback:
        return {}
    fn = load_callable(s.metrics_callback, "metrics_callback")
    joint = {(s["step"], s["turn"], s["node_id"], s["joint_idx"]): s for s in scores}
    items = {it["_item_id"]: it for it in ctx.train_items}
    samples = []
    for r in rows:
        sc = joint.get((r["step"], r["turn"], r["node_id"], r["sample"]))
        if sc is None:
            reward = None
        elif ctx.settings.actor_critic:  # its per-agent rewards (or, without them, the shared one)
            reward = sc["agent_rewards"][r["agent"]] if sc["agent_rewards"] else sc["reward"]
        else:  # the agent's share of the team reward plus its local reward
            reward = agent_reward(sc, r["agent"], s.trainer.team_reward_weight)
        sample = {k: r[k] for k in ("item_id", "turn", "agent", "sample", "prompt", "completion_text")}
        sample["reward"] = reward
        if ctx.adapter is None:
            samples.append(sample)
            continue
        # centralized: one sample per role of the joint completion, as a decentralized run would give
        roles, _ = split_roles(ctx.adapter, r["completion_text"], items[r["item_id"]], ctx.roles)
        samples += [{**sample, "agent": i, "completion_text": text} for i, text in enumerate(roles)]
    out = fn(samples)
    if not isinstance(out, dict):
        raise TypeError(f"metrics_callback {s.metrics_callback!r} must return a dict of floats, got "
                        f"{type(out).__name__}")
    return {str(k): float(v) for k, v in out.items()}


def node_means(scores: list[dict]) -> list[float]:
    """Mean reward of each node (item × turn) of a scores table."""
    nodes: dict[tuple, list[float]] = {}
    for s in scores:
        nodes.setdefault((s["turn"], s["node_id"]), []).append(s["reward"])
    return [sum(v) / len(v) for v in nodes.values()]


def last_logged_step(ctx: RunContext, seg_index: int) -> int | None:
    """The env_step of the last update whose metrics segments 0..seg_index-1 logged under this run's
    `logging_steps` (the gate: log when env_step - last logged >= logging_steps), from their stored steps."""
    last = None
    for i in range(seg_index):
        ref = ctx.store.find("steps", ctx.plan.steps_keys[i])
        for row in ctx.store.read_rows(ref) if ref is not None else []:
            if last is None or row["env_step"] - last >= ctx.settings.metrics.trainer.logging_steps:
                last = row["env_step"]
    return last


def train_segment(ctx: RunContext, seg_index: int, start: ArtifactRef | None, start_key: str,
                  show_progress: bool = False) -> SegmentResult:
    """Run (or replay) the updates of one segment and write its checkpoint, steps and metrics.

    A segment whose checkpoint (with or without optimizer state), steps and metrics are all stored returns them
    without loading a model, unless `run_segments` marked it for rebuilding (`ctx.session.rebuild`: a later
    segment must start from its optimizer state, which was dropped); a rebuild replays its stored updates.
    """
    from tqdm.auto import tqdm

    store = ctx.store
    roll, mt = ctx.settings.rollouts, ctx.settings.metrics.trainer  # what the rollouts and the metric rows read
    seg = ctx.plan.segments[seg_index]
    ends = ctx.end_keys
    end_key = ends[seg_index]
    steps_key, metrics_key = ctx.plan.steps_keys[seg_index], ctx.plan.metrics_keys[seg_index]
    done = [find_checkpoint(store, end_key), store.find("steps", steps_key), store.find("metrics", metrics_key)]
    if all(done) and seg_index not in ctx.session.rebuild:  # the whole segment is already stored: nothing to run
        return SegmentResult(done[0], done[1], done[2], cached=True)
    t_load = time.perf_counter()
    if start is None and seg_index > 0 and ctx.session.live.peek(policy_key_of(start_key)) is None:
        # the previous segment's checkpoint was still being written when it returned: committed by now, or now
        start = find_checkpoint(store, start_key)
        if start is None:
            raise ArtifactError(f"segment {seg_index + 1} starts from checkpoint {start_key}, which is not stored "
                                "(its write failed: see the error before this one); rerun to continue")
    pol = acquire_policies(ctx, start, start_key)
    fmts = formatters_for(ctx, pol)  # (with worker processes: the tokenizers loaded here, part of loading)
    t_train = time.perf_counter()
    state = dict(pol.state)
    if "last_logged" not in state:  # started from a stored checkpoint: this run's logging so far, from its steps
        state["last_logged"] = last_logged_step(ctx, seg_index)
    policy_key = start_key
    steps_rows, metric_rows = [], []
    timing: Counter = Counter()
    gen_tokens = 0
    epoch_acc: dict = {}
    lines = ExitStack()  # while the bar is drawn, log lines (Prefect's too) go through tqdm.write
    lines.enter_context(bar_safe_logging(show_progress))
    bar = tqdm(seg, desc=f"{ctx.algorithm} segment {seg_index + 1}/{len(ctx.plan.segments)}", unit="update",
               disable=not show_progress, leave=False)
    try:
        for u in bar:
            keys = update_keys(ctx, policy_key, u)
            items = [ctx.train_items[i] for i in u.item_ids]
            by_id = {it["_item_id"]: it for it in items}
            base = state.get("env_step", 0)  # env_step before this update (run-time count)
            # --- periodic evaluation (before the update whose items cross an eval_interval boundary)
            if mt.eval_interval and mt.eval_num_samples and any(i % mt.eval_interval == 0 for i in u.item_ids):
                t0 = time.perf_counter()
                ecaller, eproc, _ = ctx.eval_reward()
                erows, em = evaluate(pol, ctx.eval_items_used(), fmts, ctx.sampling, ecaller,
                                     eproc, derive_seed(roll.seed, "eval", u.index), ctx.episode, ctx.eval_hooks,
                                     samples=mt.eval_samples_per_item)
                # (its joint answers are kept beside the segment's metrics: MLflow's tables and `coopflow show` read them)
                store.put_table("eval", periodic_eval_key(metrics_key, u.index), erows,
                                meta={"checkpoint": policy_key, "update": u.index})
                ctx.session.calls["evaluate"] += 1
                timing["eval_s"] += time.perf_counter() - t0
                metric_rows += [{"key": k, "value": v, "env_step": base} for k, v in em.items()]
            # --- generate the trees, scoring each depth (or replay stored rollouts, no generation)
            t0 = time.perf_counter()
            sk = scores_key(ctx, keys.rollouts, base)
            ref = store.find("rollouts", keys.rollouts)
            if ref is None:
                r0 = ctx.caller.seconds
                rows, scores = generate_tree(pol, items, fmts, ctx.sampling, ctx.episode, ctx.caller, ctx.processor,
                                             roll.seed, u.index, base)
                reward_dt = ctx.caller.seconds - r0  # each depth is scored inside the tree
                timing["score_s"] += reward_dt
                timing["reward_s"] += reward_dt
                ref = store.put_table("rollouts", keys.rollouts, rows)
                sref = store.find("scores", sk) or store.put_table("scores", sk, scores)
                ctx.session.calls["generate"] += 1
                ctx.session.calls["score"] += 1
                gen_tokens += sum(r["length"] for r in rows)
                timing["generate_s"] += time.perf_counter() - t0 - reward_dt
                t0 = time.perf_counter()
            else:
                rows = store.read_rows(ref)
                t0 = time.perf_counter()
                r0 = ctx.caller.seconds
                sref, scores = score_or_load(ctx, rows, by_id, sk, base)
                timing["reward_s"] += ctx.caller.seconds - r0
            # --- advantages + update: the algorithm's strategy (critic-free baseline or actor-critic)
            timing["checkpoint_wait_s"] += store.settle()  # the last checkpoint is committed before the update
            step_fn = _actor_critic_update if ctx.settings.actor_critic else _baseline_update
            aref, per_turn, um = step_fn(ctx, pol, rows, scores, keys, u, timing, t0)
            per_turn.update(domain_metrics(ctx, rows, scores))
            if ctx.adapter is not None:  # joint completions the adapter could not split (their roles were all "")
                bad = parse_failures(ctx.adapter, [r["completion_text"] for r in rows],
                                     [by_id[r["item_id"]] for r in rows], ctx.roles)
                per_turn["centralized/parse_failure_rate"] = bad / len(rows)
            policy_key = keys.policy_after
            # --- metrics (the reference's names, per turn, gated by logging_steps)
            means = node_means(scores)
            reward_mean = sum(means) / len(means)
            env_step = scores[-1]["env_step"]
            last = state.get("last_logged")
            if last is None or env_step - last >= mt.logging_steps:
                state["last_logged"] = env_step
                metric_rows += [{"key": k, "value": v, "env_step": env_step} for k, v in per_turn.items()]
                metric_rows += [{"key": k, "value": v, "env_step": env_step} for k, v in um.items()]
            if ctx.algorithm == "maac":
                metric_rows += _epoch_metrics(ctx, u, per_turn, epoch_acc, env_step)
            steps_rows.append({"update": u.index, "epoch": u.epoch, "env_step": env_step, "rollouts": ref.key,
                               "scores": sref.key, "signal": aref.key, "signal_kind": aref.kind,
                               "reward_mean": reward_mean})
            state.update(update=u.index + 1, env_step=env_step, epoch=u.epoch)
            bar.set_postfix(reward=f"{reward_mean:.3f}", env_step=env_step)
    except BaseException:
        settle_quietly(ctx)  # a checkpoint written beside this segment is complete: keep it
        ctx.session.live.clear()  # the in-memory weights are mid-segment: never reuse them
        raise
    finally:
        bar.close()
        lines.close()
    # --- checkpoint + segment manifest
    t0 = time.perf_counter()
    state["segment_keys"] = ends[:seg_index + 1]
    state["segment_steps"] = list(ctx.plan.steps_keys[:seg_index + 1])
    pol.state = state
    ckpt_key = policy_key  # a checkpoint is stored under the key of the policy version it holds
    # (the logging position is this run's, not the policy's: a run with other logging settings shares the checkpoint)
    stored_state = {k: v for k, v in state.items() if k != "last_logged"}
    if writes_behind(ctx):  # written while the next segment or the evaluation starts
        ckpt = store.put_dir_behind("checkpoint", ckpt_key, lambda d: begin_checkpoint(pol, d, stored_state))
    else:
        ckpt = store.put_dir("checkpoint", ckpt_key, lambda d: save_checkpoint(pol, d, stored_state))
    ctx.session.calls["checkpoint"] += 1
    timing["checkpoint_s"] += time.perf_counter() - t0
    timing["load_s"] = t_train - t_load
    timing["train_s"] = time.perf_counter() - t_train  # the update loop + checkpoint, without model loading
    ctx.session.live.put(ckpt_key, pol)
    env_end = state["env_step"]
    total_t = sum(timing[k] for k in ("generate_s", "score_s", "update_s"))
    for k, v in timing.items():
        metric_rows.append({"key": f"timing/{k}", "value": v, "env_step": env_end})
    if timing["generate_s"] > 0:
        metric_rows.append({"key": "timing/generate_tokens_per_s", "value": gen_tokens / timing["generate_s"],
                            "env_step": env_end})
    if total_t > 0:
        n_env = env_end - seg[0].env_step_base
        metric_rows.append({"key": "timing/env_steps_per_s", "value": n_env / total_t, "env_step": env_end})
    steps = store.find("steps", steps_key) or store.put_table("steps", steps_key, steps_rows)
    metrics = store.put_table("metrics", metrics_key, metric_rows)
    return SegmentResult(ckpt, steps, metrics)


def _baseline_update(ctx: RunContext, pol, rows: list[dict], scores: list[dict], keys: UpdateKeys, u: Update,
                     timing: Counter, t0: float):
    """MAGRPO family: tree returns and group-baseline advantages (stored, or computed), then the update."""
    adv_s, pol_s, mt = ctx.settings.advantages, ctx.settings.policy, ctx.settings.metrics.trainer
    t = adv_s.trainer
    # greedy trees (AT-GRPO): each candidate is judged by its own turn's reward (only the best one continues)
    children = tree_children(rows) if ctx.episode.expansion == "all" else None
    aref = ctx.store.find("advantages", keys.advantages)
    if aref is None:
        node_item = {(r["step"], r["turn"], r["node_id"]): r["item_id"] for r in rows}
        kls = ({(r["step"], r["turn"], r["node_id"], r["agent"], r["sample"]): r["ref_kl"] for r in rows}
               if t.reference_kl_enabled else None)
        adv = compute_advantages(scores, node_item, ctx.n, t.num_generations, t.joint_mode, adv_s.advantage_mode,
                                 t.advantage_normalization, kls, t.reference_kl_coef, children, t.discount,
                                 t.advantage_normalization_scope, t.team_reward_weight)
        aref = ctx.store.put_table("advantages", keys.advantages, adv)
        ctx.session.calls["advantages"] += 1
    else:
        adv = ctx.store.read_rows(aref)
    timing["score_s"] += time.perf_counter() - t0
    t1 = time.perf_counter()
    # centralized: the joint sequence log-prob (every joint token up to and including EOS), never the padded loss
    pt = pol_s.trainer
    um = update_policies(pol, rows, adv, pt.batch_size, pol_s.seed, u.index,
                         pt.loss_on_padding and ctx.adapter is None, pt.loss_chunk_tokens,
                         Objective(pt.num_policy_epochs, pt.clip_range, pt.ratio_level))
    um.update(advantage_stats(adv, ctx.n))
    um.update(local_reward_means(scores, ctx.n))
    ctx.session.calls["update"] += 1
    timing["update_s"] += time.perf_counter() - t1
    per_turn = turn_metrics(scores, rows, joint_returns(scores, children, mt.discount),
                            mt.reference_kl_coef if mt.reference_kl_enabled else None)
    return aref, per_turn, um


def _actor_critic_update(ctx: RunContext, pol, rows: list[dict], scores: list[dict], keys: UpdateKeys, u: Update,
                        timing: Counter, t0: float):
    """IAC/MAAC: ac_samples (stored, or computed from the critics' old values) then the updates."""
    mt = ctx.settings.metrics.trainer
    aref = ctx.store.find("ac_samples", keys.advantages)
    if aref is None:
        samples = AC.build_samples(ctx, pol, rows, scores)
        aref = ctx.store.put_table("ac_samples", keys.advantages,
                                   [{k: s[k] for k in AC.AC_COLUMNS} for s in samples])
        ctx.session.calls["advantages"] += 1
    else:
        samples = AC.join_samples(ctx, rows, ctx.store.read_rows(aref))
    timing["score_s"] += time.perf_counter() - t0
    t1 = time.perf_counter()
    um = AC.update(ctx, pol, samples, ctx.settings.policy.seed, u.index)
    ctx.session.calls["update"] += 1
    timing["update_s"] += time.perf_counter() - t1
    per_turn = AC.turn_metrics(samples, um, mt.reference_kl_coef if mt.reference_kl_enabled else None)
    return aref, per_turn, um


def _epoch_metrics(ctx: RunContext, u: Update, per_turn: dict[str, float], acc: dict, env_step: int) -> list[dict]:
    """MAAC's epoch-end means `turn_t/epoch_*` (accumulated over the epoch's updates in this segment)."""
    names = {"reward_mean": "epoch_reward_mean", "expected_return": "epoch_avg_return",
             "value_pred_mean": "epoch_value_pred_mean", "value_target_mean": "epoch_value_target_mean",
             "policy_loss": "epoch_policy_loss", "value_loss": "epoch_value_loss"}
    for k, v in per_turn.items():
        turn, _, name = k.partition("/")
        if name in names and turn.startswith("turn_"):
            acc.setdefault(f"{turn}/{names[name]}", []).append(v)
    last_of_epoch = u.index + 1 >= len(ctx.plan.updates) or ctx.plan.updates[u.index + 1].epoch != u.epoch
    if not last_of_epoch:
        return []
    out = [{"key": k, "value": sum(v) / len(v), "env_step": env_step} for k, v in sorted(acc.items())]
    acc.clear()
    return out


