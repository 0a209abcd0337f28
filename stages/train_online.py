"""Online MAGRPO-family training: the step loop that chains the stages, one segment at a time.

MAGRPO in plain words: every agent samples K answers to the same task; the K joint answers are
scored with one shared reward; each agent's answer is reinforced by how much better its joint
answer scored than the group's baseline (mean, none, max or leave-one-out), and every agent takes
one policy-gradient step on its own answers. Repeat per `rollout_buffer_size` items.

One **update** u processes the next few training items (items in file order, epoch after epoch,
the last chunk of an epoch may be short): as many whole episode trees as it takes to hold
`rollout_buffer_size` node samples per agent (single turn: `rollout_buffer_size` items; a 2-turn
aligned tree of K=4 holds 5 nodes, so one item). Trees are never split across updates (the
reference splits them and carries the rest into the next item's buffer).

    generate (tree, depth by depth) + score_rewards → compute_advantages → update_policies

and each writes a Parquet artifact. Keys are input-addressed and chained, so every policy and
checkpoint key of a run is known before anything runs:

    policy_0       = key of the start (initial sources or a checkpoint)
    rollouts_u     = H(policy_u, items of u, sampling, formatters, seed, u [, episode settings])
    advantages_u   = H(rollouts_u, reward identity, joint mode, advantage mode, normalization)
    policy_{u+1}   = H(policy_u, advantages_u, learning rate, batch size)
    scores_u       = H(rollouts_u, reward identity, joint mode, env_step before u)

Multi-turn rollouts depend on the reward (early termination, feedback transitions), so their key
then also holds the reward, transition, threshold and turn count. env_step is counted at run time
(early termination makes it data-dependent), which is why only the scores key holds it.

A **segment** is a run of updates ending in a checkpoint (`checkpoint_every` updates, default one
epoch). Resuming a killed run reloads the segment's start checkpoint and *replays* the updates
whose rollouts are already stored (no generation), so no completed step is lost; a fully cached
segment is skipped outright by the flow (its checkpoint key is known in advance).
"""

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from artifacts import ArtifactError, ArtifactRef, ArtifactStore, key_for
from schemas.config import RunConfig, is_local_model_path, missing_model_dir_message
from stages import budget
from stages.build_taskset import items_digest, load_items
from stages.compute_advantages import compute_advantages
from stages.compute_advantages import joint_returns, tree_children
from stages.evaluate import eval_metrics, evaluate, hook_metrics
from stages.formatters import build_formatter
from stages.generate_rollouts import SamplingConfig, derive_seed
from stages.models import LIVE, Policies, build_tiny_model, checkpoint_sources, load_policies, save_checkpoint
from stages.rewards import RewardCaller, resolve_processor, resolve_reward, reward_identity
from stages.rollout_tree import Episode, generate_tree
from stages.score_rewards import joint_combos, score_rewards
from stages.transitions import Transition, transition_identity
from stages.train_ac import agent_specs, is_actor_critic
from stages.update_policies import update_policies

STAGE_VERSION = "2"  # 2: rollouts carry tree links

CALLS: Counter = Counter()
"""How many times each stage body actually ran in this process (generate, score, advantages, update,
evaluate, checkpoint); cached stages do not count. Used by tests and the run summary."""


# --- plan ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """One policy update: its global index, epoch, training item ids and planned env_step before it.

    The planned env_step assumes full trees; with early termination the run-time count is lower.
    """

    index: int
    epoch: int
    item_ids: tuple[int, ...]
    env_step_base: int


def plan_updates(n_items: int, epochs: int, buffer: int, joint_actions_per_item: int,
                 nodes_per_item: int = 1) -> list[Update]:
    """Every update of the run, in order: the fewest whole trees holding >= `buffer` node samples each."""
    out, env = [], 0
    per = max(1, -(-buffer // nodes_per_item))
    for e in range(epochs):
        for start in range(0, n_items, per):
            ids = tuple(range(start, min(n_items, start + per)))
            out.append(Update(len(out), e, ids, env))
            env += len(ids) * joint_actions_per_item
    return out


def plan_segments(updates: list[Update], checkpoint_every: int) -> list[list[Update]]:
    """Split updates into checkpointed segments (0 = one segment per epoch)."""
    segs: list[list[Update]] = []
    for u in updates:
        new = not segs or (checkpoint_every and len(segs[-1]) >= checkpoint_every) or \
            (not checkpoint_every and segs[-1][-1].epoch != u.epoch)
        if new:
            segs.append([])
        segs[-1].append(u)
    return segs


# --- run context ---------------------------------------------------------------------------------


@dataclass
class RunContext:
    """Everything the stages of one run need, resolved once from the config."""

    cfg: RunConfig
    store: ArtifactStore
    taskset: ArtifactRef
    train_items: list[dict]
    eval_items: list[dict]
    sources: list[str]
    start_key: str
    caller: RewardCaller
    processor: object
    reward_id: dict
    sampling: SamplingConfig
    updates: list[Update]
    segments: list[list[Update]]
    formatters: list = field(default_factory=list)
    budget: "budget.Budget | None" = None
    critic_paths: list[str] | None = None  # actor-critic: resolved critic sources (IAC separate: one per agent)
    episode: Episode = field(default_factory=Episode)
    transition_id: dict | None = None
    warnings: list[str] = field(default_factory=list)
    eval_caller: RewardCaller | None = None  # MARLHF: the task reward for evaluation (training uses the RM)
    eval_processor: object = None
    eval_reward_id: dict | None = None
    eval_hooks: tuple | None = None  # (eval_logger, eval_aggregator) from the config's import paths

    def eval_reward(self) -> tuple[RewardCaller, object, dict]:
        """(caller, processor, identity) of the reward evaluations use: always the task reward."""
        if self.eval_caller is not None:
            return self.eval_caller, self.eval_processor, self.eval_reward_id
        return self.caller, self.processor, self.reward_id

    @property
    def n(self) -> int:
        return self.cfg.agents.n

    def joint_actions_per_node(self) -> int:
        t = self.cfg.trainer
        return len(joint_combos(t.num_generations, self.n, getattr(t, "joint_mode", "aligned")))

    def nodes_per_item(self) -> int:
        """Nodes of a full episode tree (no early termination): sum over depths of branch^t."""
        return sum(self.joint_actions_per_node() ** t for t in range(self.cfg.trainer.num_turns))

    def joint_actions_per_item(self) -> int:
        return self.nodes_per_item() * self.joint_actions_per_node()


def resolve_sources(cfg: RunConfig, store: ArtifactStore) -> tuple[list[str], dict]:
    """Agent sources as loadable paths/ids, and their identity for keys ('tiny' is built into the store)."""
    paths, ident = resolve_model_sources(cfg.agents.sources(), cfg, store, "agents")
    return paths, {"sources": ident, "dtype": cfg.agents.dtype}


def resolve_model_sources(sources: list[str], cfg: RunConfig, store: ArtifactStore,
                          what: str) -> tuple[list[str], list[dict]]:
    """Model sources ('tiny', local dirs, hub ids) as loadable paths/ids plus their identities."""
    paths, ident = [], []
    for src in sources:
        if src == "tiny":
            a = cfg.agents
            key = key_for("model", {"tiny": [a.tiny_hidden_size, a.tiny_num_layers], "v": STAGE_VERSION})
            ref = store.put_dir("model", key, lambda d: build_tiny_model(d, a.tiny_hidden_size, a.tiny_num_layers))
            paths.append(str(store.open_dir(ref)))
            ident.append({"model": key})
        elif Path(src).expanduser().is_dir():
            p = Path(src).expanduser().resolve()
            files = sorted((f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in p.iterdir() if f.is_file())
            paths.append(str(p))
            ident.append({"dir": str(p), "files": files})
        elif is_local_model_path(src):
            raise FileNotFoundError(missing_model_dir_message(what, src))
        else:
            paths.append(src)
            ident.append({"hub": src})
    return paths, ident


def make_context(cfg: RunConfig, store: ArtifactStore, taskset: ArtifactRef, sources: list[str] | None = None,
                 source_ident: dict | None = None, reward_override: tuple | None = None) -> RunContext:
    """Resolve config + taskset into a RunContext (loads no model).

    `reward_override` = (reward function, identity): train on another reward (MARLHF's frozen reward
    model) while evaluations keep the task reward.
    """
    if sources is None:
        sources, source_ident = resolve_sources(cfg, store)
    t = cfg.trainer
    train = load_items(store, taskset, "train")
    evals = load_items(store, taskset, "eval")
    task_caller = RewardCaller(resolve_reward(cfg.reward.name, cfg.reward.kwargs), cfg.agents.n)
    caller = RewardCaller(reward_override[0], cfg.agents.n) if reward_override else task_caller
    sampling = SamplingConfig.of(cfg, t.num_generations)
    ac = is_actor_critic(cfg)
    init: dict = {"init": source_ident}
    critic_paths = None
    if ac and cfg.critic_sources():
        critic_paths, cident = resolve_model_sources(cfg.critic_sources(), cfg, store, "critic")
        init.update(critics=cident, algorithm=cfg.algorithm, critic_type=t.critic_type)
    elif ac:
        init.update(algorithm=cfg.algorithm, shared_head=t.value_head_hidden_dim, critic_type=t.critic_type)
    ctx = RunContext(cfg=cfg, store=store, taskset=taskset, train_items=train, eval_items=evals, sources=sources,
                     start_key=key_for("policy", init), caller=caller, critic_paths=critic_paths,
                     processor=resolve_processor(cfg.reward.processor),
                     reward_id=reward_identity(cfg.reward.name, cfg.reward.kwargs, cfg.reward.processor),
                     sampling=sampling, updates=[], segments=[])
    multi = t.num_turns > 1 and cfg.transition is not None
    joint_mode = getattr(t, "joint_mode", "aligned")
    ctx.episode = Episode(t.num_turns if multi else 1, joint_mode,
                          Transition(cfg.transition.name, cfg.transition.kwargs) if multi else None,
                          t.early_termination_threshold, t.external_prompt_passthrough, t.discount, reward_per_node=ac)
    if multi:
        ctx.transition_id = transition_identity(cfg.transition.name, cfg.transition.kwargs)
    # MAGRPO's rollout_buffer_size counts tree nodes per agent; the actor-critic trainers count samples per agent.
    units = ctx.nodes_per_item() * (t.num_generations if ac else 1)
    ctx.updates = plan_updates(len(train), t.num_train_epochs, t.rollout_buffer_size, ctx.joint_actions_per_item(),
                               units)
    ctx.segments = plan_segments(ctx.updates, cfg.checkpoint_every)
    n_eval = len(evals[:t.eval_num_samples] if t.eval_num_samples else evals)
    ctx.budget = budget.estimate(len(train), n_eval, cfg.agents.n, t.num_generations, t.num_turns, joint_mode,
                                 t.num_train_epochs, len(ctx.updates[0].item_ids) if ctx.updates else 1)
    budget.check(ctx.budget, cfg.max_sequences)
    warn = budget.unreachable_turns_warning(t.num_turns, t.early_termination_threshold,
                                            processed_range(caller.fn, cfg.reward.reward_range, ctx.processor))
    if warn:
        ctx.warnings.append(warn)
    if cfg.eval_logger and cfg.eval_aggregator:
        from stages.rewards import load_callable

        ctx.eval_hooks = (load_callable(cfg.eval_logger, "eval_logger"),
                          load_callable(cfg.eval_aggregator, "eval_aggregator"))
    if reward_override:
        ctx.eval_caller, ctx.eval_processor, ctx.eval_reward_id = task_caller, ctx.processor, ctx.reward_id
        ctx.reward_id, ctx.processor = reward_override[1], resolve_processor(None)
    return ctx


def processed_range(fn, declared: tuple | None, processor) -> tuple[float, float] | None:
    """The reward's declared (config, else `fn.reward_range`) range mapped through the processor."""
    rng = declared or getattr(fn, "reward_range", None) or getattr(getattr(fn, "func", None), "reward_range", None)
    if rng is None:
        return None
    ends = [float(processor(float(rng[0]))), float(processor(float(rng[1])))]
    return min(ends), max(ends)


def formatters_for(ctx: RunContext, policies: Policies | None) -> list:
    """Per-agent formatter functions (chat templates need the loaded tokenizers)."""
    toks = policies.tokenizers if policies else [None] * ctx.n
    return [build_formatter(ctx.cfg.formatter_for(i), toks[i]) for i in range(ctx.n)]


# --- keys ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateKeys:
    rollouts: str
    advantages: str
    policy_after: str


def scores_key(ctx: RunContext, rollouts_key: str, env_step_base: int) -> str:
    """Key of the scores of one rollouts artifact under this run's reward and joint mode."""
    return key_for("scores", {"rollouts": rollouts_key, "reward": ctx.reward_id, "per_node": ctx.episode.reward_per_node,
                              "joint_mode": ctx.episode.joint_mode, "env_step_base": env_step_base})


def score_or_load(ctx: RunContext, rows: list[dict], by_id: dict[int, dict], key: str,
                  env_step_base: int) -> tuple[ArtifactRef, list[dict]]:
    """The scores artifact `key`: read it when stored, else score the rollout rows and store them."""
    ref = ctx.store.find("scores", key)
    if ref is not None:
        return ref, ctx.store.read_rows(ref)
    scores = ctx.episode.score(rows, by_id, ctx.caller, ctx.processor, env_step_base)
    CALLS["score"] += 1
    return ctx.store.put_table("scores", key, scores), scores


def update_keys(ctx: RunContext, policy_key: str, u: Update) -> UpdateKeys:
    """The chained artifact keys of one update (spec'd in the module docstring)."""
    cfg, t = ctx.cfg, ctx.cfg.trainer
    items = [ctx.train_items[i] for i in u.item_ids]
    fmt = [cfg.formatter_for(i).model_dump() for i in range(ctx.n)]
    spec = {"policy": policy_key, "items": items_digest(items), "sampling": ctx.sampling.__dict__,
            "formatters": fmt, "seed": cfg.seed, "update": u.index, "v": STAGE_VERSION,
            "reference_kl": t.reference_kl_enabled}
    if t.num_turns > 1:  # the tree's shape and later prompts depend on these
        spec["episode"] = {"turns": t.num_turns, "transition": ctx.transition_id, "reward": ctx.reward_id,
                           "joint_mode": ctx.episode.joint_mode, "threshold": t.early_termination_threshold,
                           "passthrough": t.external_prompt_passthrough, "per_node": ctx.episode.reward_per_node}
    rk = key_for("rollouts", spec)
    kl = t.reference_kl_coef if t.reference_kl_enabled else None
    if is_actor_critic(cfg):
        ak = key_for("ac_samples", {"rollouts": rk, "reward": ctx.reward_id, "algorithm": cfg.algorithm,
                                    "critic_type": t.critic_type, "discount": t.discount, "kl_coef": kl,
                                    "norm": t.advantage_normalization})
        pk = key_for("policy", {"prev": policy_key, "ac_samples": ak, "lr": t.agent_learning_rate,
                                "critic_lr": t.critic_lr, "coef": t.value_loss_coef,
                                "clip": getattr(t, "value_clip_range", None), "batch": t.batch_size, "seed": cfg.seed})
        return UpdateKeys(rk, ak, pk)
    adv = {"rollouts": rk, "reward": ctx.reward_id, "joint_mode": t.joint_mode, "mode": cfg.advantage_mode,
           "norm": t.advantage_normalization, "kl_coef": kl}
    if t.num_turns > 1:
        adv["discount"] = t.discount
    ak = key_for("advantages", adv)
    spec = {"prev": policy_key, "advantages": ak, "lr": t.agent_learning_rate, "batch": t.batch_size, "seed": cfg.seed}
    if t.loss_on_padding:  # the reference's exact loss (pads scored, each row's last token not)
        spec["loss"] = "comlrl-1.4.3"
    return UpdateKeys(rk, ak, key_for("policy", spec))


def segment_end_keys(ctx: RunContext) -> list[str]:
    """Checkpoint key (= policy version key) at the end of every segment, computable before anything runs."""
    out, pk = [], ctx.start_key
    for seg in ctx.segments:
        for u in seg:
            pk = update_keys(ctx, pk, u).policy_after
        out.append(pk)
    return out


# --- policies at a segment boundary --------------------------------------------------------------


def _open_policies(ctx: RunContext, sources: list, optimizer_files: list | None, state: dict):
    """In-process Policies, or one worker process per agent when parallel_training is 'mp'."""
    from stages.agent_workers import WorkerPolicies, agent_devices

    a, t = ctx.cfg.agents, ctx.cfg.trainer
    devices = agent_devices(t.agent_devices, ctx.n, a.device)
    # The frozen references are always the *initial* agent sources (also when resuming a checkpoint).
    refs = list(ctx.sources) if t.reference_kl_enabled else None
    rdev = agent_devices(t.reference_devices, ctx.n, devices[0]) if t.reference_devices else devices
    ckpt = Path(sources[0]).parent if optimizer_files else None  # a checkpoint dir (agent_i/ + optimizer/)
    critics = ctx.critic_paths
    if ckpt is not None and ctx.cfg.algorithm == "iac" and critics:
        critics = [str(ckpt / f"agent_{i}" / "critic") for i in range(ctx.n)]
    specs = agent_specs(ctx.cfg, critics, devices, ckpt / "optimizer" if ckpt is not None else None)
    if t.parallel_training == "mp":
        pol = WorkerPolicies(sources, t.agent_learning_rate, a.dtype, a.attn_implementation, devices,
                             optimizer_files, refs, rdev, specs)
    else:
        pol = load_policies(sources, t.agent_learning_rate, a.dtype, a.attn_implementation, a.device, optimizer_files,
                            refs, rdev, specs)
    if ctx.cfg.algorithm == "maac":
        from stages.agent_workers import agent_devices as resolve_devices
        from stages.models import load_critic

        src = str(ckpt / "critic") if ckpt is not None else ctx.critic_paths[0]
        cdev = resolve_devices(t.critic_devices, 1, devices[0])[0]
        pol.critic = load_critic(src, t.critic_lr, t.critic_value_head_hidden_dim, a.dtype, a.attn_implementation, cdev,
                                 ckpt / "optimizer" / "critic.pt" if ckpt is not None else None, pol.tokenizers[0],
                                 derive_seed(ctx.cfg.seed, "central_critic_head"))
    pol.state = state
    return pol


def acquire_policies(ctx: RunContext, start: ArtifactRef | None, start_key: str):
    """Live policies for a segment start: in-memory when possible, else the checkpoint, else the sources."""
    pol = LIVE.take(start_key)
    if pol is not None:
        return pol
    LIVE.clear()
    if start is None:
        return _open_policies(ctx, ctx.sources, None, {"update": 0, "env_step": 0, "last_logged": None})
    dirs, opts, state = checkpoint_sources(ctx.store.open_dir(start), ctx.n)
    return _open_policies(ctx, dirs, opts, state)


def peek_policies(ctx: RunContext, ckpt: ArtifactRef):
    """Policies of a checkpoint for read-only use (evaluation), reusing the live copy if it matches."""
    if LIVE.key == ckpt.key and LIVE.policies is not None:
        return LIVE.policies
    dirs, opts, state = checkpoint_sources(ctx.store.open_dir(ckpt), ctx.n)
    pol = _open_policies(ctx, dirs, opts, state)
    LIVE.put(ckpt.key, pol)
    return pol


# --- one segment ---------------------------------------------------------------------------------


@dataclass
class SegmentResult:
    """Refs a finished segment produced (all artifacts) and what actually ran."""

    checkpoint: ArtifactRef
    steps: ArtifactRef
    metrics: ArtifactRef
    executed: dict = field(default_factory=dict)
    cached: bool = False


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
    if not ctx.cfg.metrics_callback:
        return {}
    from stages.rewards import load_callable

    fn = load_callable(ctx.cfg.metrics_callback, "metrics_callback")
    joint = {(s["step"], s["turn"], s["node_id"], s["joint_idx"]): s for s in scores}
    samples = []
    for r in rows:
        s = joint.get((r["step"], r["turn"], r["node_id"], r["sample"]))
        reward = (s["agent_rewards"][r["agent"]] if s and s["agent_rewards"] else s["reward"] if s else None)
        samples.append({k: r[k] for k in ("item_id", "turn", "agent", "sample", "prompt", "completion_text")}
                       | {"reward": reward})
    out = fn(samples)
    if not isinstance(out, dict):
        raise TypeError(f"metrics_callback {ctx.cfg.metrics_callback!r} must return a dict of floats, got "
                        f"{type(out).__name__}")
    return {str(k): float(v) for k, v in out.items()}


def node_means(scores: list[dict]) -> list[float]:
    """Mean reward of each node (item × turn) of a scores table."""
    nodes: dict[tuple, list[float]] = {}
    for s in scores:
        nodes.setdefault((s["turn"], s["node_id"]), []).append(s["reward"])
    return [sum(v) / len(v) for v in nodes.values()]


def train_segment(ctx: RunContext, seg_index: int, start: ArtifactRef | None, start_key: str,
                  show_progress: bool = False) -> SegmentResult:
    """Run (or replay) the updates of one segment and write its checkpoint, steps and metrics.

    A segment whose checkpoint, steps and metrics are all stored returns them without loading a model.
    """
    from tqdm.auto import tqdm

    store, cfg, t = ctx.store, ctx.cfg, ctx.cfg.trainer
    seg = ctx.segments[seg_index]
    ends = segment_end_keys(ctx)
    end_key = ends[seg_index]
    done = [store.find(kind, end_key) for kind in ("checkpoint", "steps", "metrics")]
    if all(done):  # the whole segment is already stored: nothing to run
        return SegmentResult(done[0], done[1], done[2], {}, cached=True)
    t_load = time.perf_counter()
    pol = acquire_policies(ctx, start, start_key)
    t_train = time.perf_counter()
    fmts = formatters_for(ctx, pol)
    state = dict(pol.state)
    policy_key = start_key
    steps_rows, metric_rows = [], []
    executed: Counter = Counter()
    timing: Counter = Counter()
    gen_tokens = 0
    epoch_acc: dict = {}
    bar = tqdm(seg, desc=f"{cfg.algorithm} segment {seg_index + 1}/{len(ctx.segments)}", unit="update",
               disable=not show_progress, leave=False)
    try:
        for u in bar:
            keys = update_keys(ctx, policy_key, u)
            items = [ctx.train_items[i] for i in u.item_ids]
            by_id = {it["_item_id"]: it for it in items}
            base = state.get("env_step", 0)  # env_step before this update (run-time count)
            # --- periodic evaluation (before the update whose items cross an eval_interval boundary)
            if t.eval_interval and t.eval_num_samples and any(i % t.eval_interval == 0 for i in u.item_ids):
                t0 = time.perf_counter()
                ecaller, eproc, _ = ctx.eval_reward()
                _, em = evaluate(pol, ctx.eval_items[:t.eval_num_samples], fmts, ctx.sampling, ecaller,
                                 eproc, derive_seed(cfg.seed, "eval", u.index), ctx.episode, ctx.eval_hooks)
                CALLS["evaluate"] += 1
                timing["eval_s"] += time.perf_counter() - t0
                metric_rows += [{"key": k, "value": v, "env_step": base} for k, v in em.items()]
            # --- generate the trees, scoring each depth (or replay stored rollouts, no generation)
            t0 = time.perf_counter()
            sk = scores_key(ctx, keys.rollouts, base)
            ref = store.find("rollouts", keys.rollouts)
            if ref is None:
                rows, scores = generate_tree(pol, items, fmts, ctx.sampling, ctx.episode, ctx.caller, ctx.processor,
                                             cfg.seed, u.index, base)
                ref = store.put_table("rollouts", keys.rollouts, rows)
                sref = store.find("scores", sk) or store.put_table("scores", sk, scores)
                CALLS["generate"] += 1
                CALLS["score"] += 1
                executed["generate"] += 1
                gen_tokens += sum(r["length"] for r in rows)
                timing["generate_s"] += time.perf_counter() - t0
                t0 = time.perf_counter()
            else:
                rows = store.read_rows(ref)
                executed["replayed"] += 1
                t0 = time.perf_counter()
                sref, scores = score_or_load(ctx, rows, by_id, sk, base)
            # --- advantages + update: the algorithm's strategy (critic-free baseline or actor-critic)
            step_fn = _actor_critic_update if is_actor_critic(cfg) else _baseline_update
            aref, per_turn, um = step_fn(ctx, pol, rows, scores, keys, u, timing, t0)
            per_turn.update(domain_metrics(ctx, rows, scores))
            executed["update"] += 1
            policy_key = keys.policy_after
            # --- metrics (the reference's names, per turn, gated by logging_steps)
            means = node_means(scores)
            reward_mean = sum(means) / len(means)
            env_step = scores[-1]["env_step"]
            last = state.get("last_logged")
            if last is None or env_step - last >= t.logging_steps:
                state["last_logged"] = env_step
                metric_rows += [{"key": k, "value": v, "env_step": env_step} for k, v in per_turn.items()]
                metric_rows += [{"key": k, "value": v, "env_step": env_step} for k, v in um.items()]
            if cfg.algorithm == "maac":
                metric_rows += _epoch_metrics(ctx, u, per_turn, epoch_acc, env_step)
            steps_rows.append({"update": u.index, "epoch": u.epoch, "env_step": env_step, "rollouts": ref.key,
                               "scores": sref.key, "advantages": aref.key, "reward_mean": reward_mean})
            state.update(update=u.index + 1, env_step=env_step, epoch=u.epoch)
            bar.set_postfix(reward=f"{reward_mean:.3f}", env_step=env_step)
    except BaseException:
        LIVE.clear()  # the in-memory weights are mid-segment: never reuse them
        raise
    finally:
        bar.close()
    # --- checkpoint + segment manifest
    t0 = time.perf_counter()
    state["segment_keys"] = ends[:seg_index + 1]
    pol.state = state
    ckpt_key = policy_key  # a checkpoint is stored under the key of the policy version it holds
    ckpt = store.put_dir("checkpoint", ckpt_key, lambda d: save_checkpoint(pol, d, state))
    CALLS["checkpoint"] += 1
    timing["checkpoint_s"] += time.perf_counter() - t0
    timing["load_s"] = t_train - t_load
    timing["train_s"] = time.perf_counter() - t_train  # the update loop + checkpoint, without model loading
    LIVE.put(ckpt_key, pol)
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
    steps = store.put_table("steps", ckpt_key, steps_rows)
    metrics = store.put_table("metrics", ckpt_key, metric_rows)
    return SegmentResult(ckpt, steps, metrics, dict(executed))


def _baseline_update(ctx: RunContext, pol, rows: list[dict], scores: list[dict], keys: UpdateKeys, u: Update,
                     timing: Counter, t0: float):
    """MAGRPO family: tree returns and group-baseline advantages (stored, or computed), then the update."""
    t, cfg = ctx.cfg.trainer, ctx.cfg
    children = tree_children(rows)
    aref = ctx.store.find("advantages", keys.advantages)
    if aref is None:
        node_item = {(r["step"], r["turn"], r["node_id"]): r["item_id"] for r in rows}
        kls = ({(r["step"], r["turn"], r["node_id"], r["agent"], r["sample"]): r["ref_kl"] for r in rows}
               if t.reference_kl_enabled else None)
        adv = compute_advantages(scores, node_item, ctx.n, t.num_generations, t.joint_mode, cfg.advantage_mode,
                                 t.advantage_normalization, kls, t.reference_kl_coef, children, t.discount)
        aref = ctx.store.put_table("advantages", keys.advantages, adv)
        CALLS["advantages"] += 1
    else:
        adv = ctx.store.read_rows(aref)
    timing["score_s"] += time.perf_counter() - t0
    t1 = time.perf_counter()
    um = update_policies(pol, rows, adv, t.batch_size, cfg.seed, u.index, t.loss_on_padding)
    CALLS["update"] += 1
    timing["update_s"] += time.perf_counter() - t1
    per_turn = turn_metrics(scores, rows, joint_returns(scores, children, t.discount),
                            t.reference_kl_coef if t.reference_kl_enabled else None)
    return aref, per_turn, um


def _actor_critic_update(ctx: RunContext, pol, rows: list[dict], scores: list[dict], keys: UpdateKeys, u: Update,
                        timing: Counter, t0: float):
    """IAC/MAAC: ac_samples (stored, or computed from the critics' old values) then the updates."""
    from stages import train_ac

    t = ctx.cfg.trainer
    aref = ctx.store.find("ac_samples", keys.advantages)
    if aref is None:
        samples = train_ac.build_samples(ctx, pol, rows, scores)
        aref = ctx.store.put_table("ac_samples", keys.advantages,
                                   [{k: s[k] for k in train_ac.AC_COLUMNS} for s in samples])
        CALLS["advantages"] += 1
    else:
        samples = train_ac.join_samples(ctx, rows, ctx.store.read_rows(aref))
    timing["score_s"] += time.perf_counter() - t0
    t1 = time.perf_counter()
    um = train_ac.update(ctx, pol, samples, ctx.cfg.seed, u.index)
    CALLS["update"] += 1
    timing["update_s"] += time.perf_counter() - t1
    per_turn = train_ac.turn_metrics(samples, um, t.reference_kl_coef if t.reference_kl_enabled else None)
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
    last_of_epoch = u.index + 1 >= len(ctx.updates) or ctx.updates[u.index + 1].epoch != u.epoch
    if not last_of_epoch:
        return []
    out = [{"key": k, "value": sum(v) / len(v), "env_step": env_step} for k, v in sorted(acc.items())]
    acc.clear()
    return out


def refit_critic(ctx: RunContext, ckpt: ArtifactRef, steps_refs: list[ArtifactRef]) -> tuple[ArtifactRef, dict]:
    """Re-fit the trained critic(s) of `ckpt` on the run's stored samples (rollouts + ac_samples), no
    generation: a `critic` artifact (agent_i/ for IAC, critic/ for MAAC) and the value loss before/after."""
    from stages import train_ac
    from stages.fit_critic import fit_critic, predict_values
    from stages.models import load_critic, save_critic

    cfg, t, store = ctx.cfg, ctx.cfg.trainer, ctx.store
    if not is_actor_critic(cfg) or (cfg.algorithm == "iac" and not t.use_separate_critic):
        raise ValueError("the 'critic' stage re-fits separate critics: it needs train-iac with use_separate_critic "
                         "(a shared value head trains with its actor) or train-maac")
    samples, ac_keys = [], []
    for ref in steps_refs:
        for step in store.read_rows(ref):
            rows, ac = store.find("rollouts", step["rollouts"]), store.find("ac_samples", step["advantages"])
            if rows is None or ac is None:
                raise ArtifactError(f"stored samples of update {step['update']} not found; cannot re-fit the critic")
            samples += train_ac.join_samples(ctx, store.read_rows(rows), store.read_rows(ac))
            ac_keys.append(step["advantages"])
    c = cfg.critic
    lr = c.refit_learning_rate or t.critic_lr
    key = key_for("critic", {"checkpoint": ckpt.key, "samples": ac_keys, "epochs": c.refit_epochs, "lr": lr,
                             "batch": t.batch_size, "seed": cfg.seed})
    root = store.open_dir(ckpt)
    if cfg.algorithm == "maac":
        jobs = [("critic", root / "critic", samples)]
    else:
        jobs = [(f"agent_{i}", root / f"agent_{i}" / "critic", [s for s in samples if s["agent"] == i])
                for i in range(ctx.n)]
    a = cfg.agents
    crits = [(name, load_critic(src, lr, None, a.dtype, a.attn_implementation, a.device), mine)
             for name, src, mine in jobs]

    def mse(crit, mine) -> float:
        v = predict_values(crit, mine, t.critic_type)
        return sum((s["value_target"] - x) ** 2 for s, x in zip(mine, v)) / max(1, len(mine))

    metrics = {"critic_refit/value_loss_before": sum(mse(cr, m) for _, cr, m in crits) / len(crits)}
    found = store.find("critic", key)
    if found is None:
        for _, crit, mine in crits:
            fit_critic(crit, mine, t.critic_type, t.batch_size, c.refit_epochs, 1.0, cfg.seed)
        found = store.put_dir("critic", key, lambda d: [save_critic(crit, d / name) for name, crit, _ in crits])
        CALLS["fit_critic"] += 1
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
            base = step["env_step"] - len({(r["turn"], r["node_id"]) for r in rows}) * ctx.joint_actions_per_node()
            _, scores = score_or_load(ctx, rows, by_id, scores_key(ctx, step["rollouts"], base), base)
            means = node_means(scores)
            out.append({"key": "rescore/turn_1/reward_mean", "value": sum(means) / len(means),
                        "env_step": step["env_step"]})
    return out


def train_seconds(store: ArtifactStore, metrics_refs: list[ArtifactRef]) -> tuple[float, float]:
    """(training seconds without model loading, model loading seconds) summed over segments' stored metrics."""
    train = load = 0.0
    for ref in metrics_refs:
        for r in store.read_rows(ref):
            if r["key"] == "timing/train_s":
                train += r["value"]
            elif r["key"] == "timing/load_s":
                load += r["value"]
    return train, load


def first_last_fifth(values: list[float]) -> tuple[float | None, float | None]:
    """Mean of the first and last fifth of a series (at least one value each)."""
    if not values:
        return None, None
    k = max(1, math.floor(len(values) / 5))
    return sum(values[:k]) / k, sum(values[-k:]) / k


# --- final evaluation ----------------------------------------------------------------------------


def eval_key(ctx: RunContext, ckpt_key: str) -> str:
    """Key of the final evaluation artifact of a checkpoint."""
    t = ctx.cfg.trainer
    items = ctx.eval_items[:t.eval_num_samples] if t.eval_num_samples else ctx.eval_items
    fmt = [ctx.cfg.formatter_for(i).model_dump() for i in range(ctx.n)]
    spec = {"checkpoint": ckpt_key, "items": items_digest(items), "sampling": ctx.sampling.__dict__,
            "reward": ctx.eval_reward()[2], "formatters": fmt, "seed": ctx.cfg.seed}
    if t.num_turns > 1:
        spec["episode"] = {"turns": t.num_turns, "transition": ctx.transition_id, "discount": t.discount,
                           "passthrough": t.external_prompt_passthrough}
    return key_for("eval", spec)


def evaluate_checkpoint(ctx: RunContext, ckpt: ArtifactRef) -> tuple[ArtifactRef, dict[str, float]]:
    """Evaluate a checkpoint on the eval split (eval_num_samples items; all when 0) -> eval artifact + metrics."""
    t = ctx.cfg.trainer
    items = ctx.eval_items[:t.eval_num_samples] if t.eval_num_samples else ctx.eval_items
    key = eval_key(ctx, ckpt.key)
    found = ctx.store.find("eval", key)
    if found is not None:
        rows = ctx.store.read_rows(found)
        metrics = eval_metrics(rows)
        if ctx.eval_hooks:  # hook metrics are computed from the stored rows, not stored themselves
            metrics.update(hook_metrics(rows, items, ctx.n, ctx.episode.num_turns, *ctx.eval_hooks))
        return found, metrics
    pol = peek_policies(ctx, ckpt)
    ecaller, eproc, _ = ctx.eval_reward()
    rows, metrics = evaluate(pol, items, formatters_for(ctx, pol), ctx.sampling, ecaller, eproc,
                             derive_seed(ctx.cfg.seed, "final-eval"), ctx.episode, ctx.eval_hooks)
    CALLS["evaluate"] += 1
    return ctx.store.put_table("eval", key, rows), metrics
