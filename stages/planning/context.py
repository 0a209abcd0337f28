"""What one run needs, resolved once from its config: the run context and its immutable plan.

`make_context(cfg, store, taskset)` loads no model. It resolves the agent sources ('tiny' is built
into the store), the items, the reward (and, for MARLHF's RL phase, the reward model that replaces
it in training), the sampling settings and the episode shape, then plans the whole run
(`stages.planning.plan`): the updates and segments, the policy key at the start and the checkpoint key
at the end of every segment (computable before anything runs because every key is input-addressed,
see `stages.planning.keys`), the budget (updates, generate calls, sequences, joint actions; refused up
front when over `max_sequences`) and planning warnings (e.g. unreachable later turns).

`RunPlan` and `RunContext` are frozen: nothing changes them after `make_context`. What a run
creates while it runs (live policies, stage counters) lives in its `Session`.
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from coopflow.artifacts import ArtifactRef, ArtifactStore
from coopflow.schemas.config import (FormatterConfig, RunConfig, is_local_model_path, missing_model_dir_message,
                                     rl_trainer_fields, validate_config)
from coopflow.stages.agents.catalog import install, is_catalog_name
from coopflow.stages.agents.decode import resolve_compute_dtype
from coopflow.stages.agents.hardware import fast_bf16_attention
from coopflow.stages.agents.models import build_tiny_model, resolve_device
from coopflow.stages.planning import budget
from coopflow.stages.planning.keys import declared_key, segment_end_keys, segment_record_keys, start_key
from coopflow.stages.planning.settings import RunSettings
from coopflow.stages.common.code_identity import planning
from coopflow.stages.common.stage_code import CODE, kind_code
from coopflow.stages.planning.plan import (RunPlan, plan_segments, plan_updates,
                               trains_in_segments)
from coopflow.stages.planning.session import Session
from coopflow.stages.rollout.generate import SamplingConfig
from coopflow.stages.rollout.tree import Episode
from coopflow.stages.score.executors import make_executor
from coopflow.stages.score.rewards import RewardCaller, declared_range, resolve_processor, resolve_reward
from coopflow.stages.score.scores import joint_combos
from coopflow.stages.tasks.centralized import CentralizedReward, JointFormatter, RoleSplitLogger, load_adapter
from coopflow.stages.tasks.formatters import build_formatter, chat_wrapper, role_formatter
from coopflow.stages.tasks.taskset import eval_overlap, load_items
from coopflow.stages.tasks.transitions import Transition


@dataclass(frozen=True)
class Reward:
    """A reward as the stages call it: the caller, the processor of its raw values and its key identity."""

    caller: RewardCaller
    processor: object
    identity: dict


# --- run context ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RunContext:
    """Everything the stages of one run read, resolved once from the config (frozen; see module doc).

    The stages see no config: each reads the settings its key holds through `settings.<kind>` (a view that
    refuses any other field, see `stages.planning.settings`) and the objects resolved here from those settings.
    """

    settings: RunSettings
    store: ArtifactStore
    taskset: ArtifactRef
    train_items: list[dict]
    eval_items: list[dict]
    sources: list[str]  # loadable agent sources (paths or hub ids)
    reward: Reward  # what training scores with (MARLHF's RL phase: the frozen reward model)
    task_reward: Reward  # what evaluations score with: always the task reward
    sampling: SamplingConfig  # the rollouts' sampling (built from the rollouts settings)
    eval_sampling: SamplingConfig  # the evaluations' sampling (built from the eval settings)
    episode: Episode
    plan: RunPlan
    n: int  # trained policies: the N agents, or the one joint actor of centralized collaboration
    roles: int  # roles of the task (= agents when decentralized)
    eval_used: int = 0  # eval items the evaluations run on (the first eval_num_samples; 0 = all)
    joint_actions_per_node: int = 1  # joint actions scored at one tree node
    nodes_per_item: int = 1  # nodes of a full episode tree (no early termination)
    session: Session = field(default_factory=Session)
    critic_paths: list[str] | None = None  # actor-critic: resolved critic sources (IAC separate: one per agent)
    eval_hooks: tuple | None = None  # (eval_logger, eval_aggregator) from the config's import paths
    adapter: object | None = None  # centralized collaboration: the adapter between roles and the joint actor

    @property
    def algorithm(self) -> str:
        """The algorithm (a start input: every key holds it)."""
        return self.settings.start.algorithm

    # the training reward's parts, as the stages take them
    @property
    def caller(self) -> RewardCaller:
        return self.reward.caller

    @property
    def processor(self):
        return self.reward.processor

    @property
    def reward_id(self) -> dict:
        return self.reward.identity

    def eval_reward(self) -> tuple[RewardCaller, object, dict]:
        """(caller, processor, identity) of the reward evaluations use: always the task reward."""
        r = self.task_reward
        return r.caller, r.processor, r.identity

    @property
    def end_keys(self) -> tuple[str, ...]:
        """Checkpoint key (= policy version key) at the end of every segment, known before anything runs."""
        return self.plan.end_keys

    @property
    def run_key(self) -> str:
        """The final checkpoint's key (names the run)."""
        return self.plan.end_keys[-1]

    def eval_items_used(self) -> list[dict]:
        """The eval items evaluations run on (the first eval_num_samples; all when 0)."""
        return self.eval_items[:self.eval_used] if self.eval_used else self.eval_items

    def joint_actions_per_item(self) -> int:
        return self.nodes_per_item * self.joint_actions_per_node

    def with_plan(self, **changes) -> "RunContext":
        """A copy with some plan fields replaced (e.g. another budget); the session is shared."""
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, **changes))


def resolve_sources(cfg: RunConfig, store: ArtifactStore,
                    settings: RunSettings | None = None) -> tuple[list[str], dict]:
    """Agent sources as loadable paths/ids, and their identity for keys ('tiny' is built into the store)."""
    settings = settings or RunSettings.of(cfg)
    paths, ident = resolve_model_sources(cfg.actor_sources(), settings, store, "agents")
    # (the dtype, LoRA and compute settings enter the start key as its declared inputs; `auto` compute resolves
    # by device, so the resolved one is part of the identity, and with a narrower compute dtype so is whether the
    # device's bf16 attention is the faster kernel: it decides the decode loop's KV cache and the loss passes'
    # attention dtype, `hardware.fast_bf16_attention`)
    compute = resolve_compute_dtype(cfg.agents.compute_dtype, cfg.agents.device)
    identity = {"sources": ident, "compute_dtype": compute}
    if compute != "model":
        identity["fast_bf16_attention"] = fast_bf16_attention(resolve_device(cfg.agents.device))
    return paths, identity


def resolve_model_sources(sources: list[str], settings: RunSettings, store: ArtifactStore,
                          what: str) -> tuple[list[str], list[dict]]:
    """Model sources ('tiny', catalog names, local dirs, hub ids) as loadable paths/ids plus their identities."""
    paths, ident = [], []
    for src in sources:
        if src == "tiny":
            a = settings.model.agents
            key = declared_key("model", "model", settings, {})
            ref = store.put_dir("model", key, lambda d: build_tiny_model(d, a.tiny_hidden_size, a.tiny_num_layers))
            paths.append(str(store.open_dir(ref)))
            ident.append({"model": key})
        elif is_catalog_name(src):  # a pretrained model from the catalog, converted once into the store
            d = install(src, store)
            paths.append(str(d))
            ident.append({"catalog": src, "model": d.name})
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
                 source_ident: dict | None = None, reward_override: tuple | None = None,
                 session: Session | None = None) -> RunContext:
    """Resolve config + taskset into a frozen RunContext with its plan (loads no model).

    `reward_override` = (reward function, identity): train on another reward (MARLHF's frozen reward
    model) while evaluations keep the task reward. `session`: share a parent run's live resources.
    """
    with planning():  # the whole plan's keys see one state of the code (each closure checked against its files once)
        for kind in CODE:  # read every stage's code now, not on the first update that keys an artifact of its kind
            kind_code(kind)
        return _make_context(cfg, store, taskset, sources, source_ident, reward_override, session)


def _make_context(cfg: RunConfig, store: ArtifactStore, taskset: ArtifactRef, sources: list[str] | None = None,
                  source_ident: dict | None = None, reward_override: tuple | None = None,
                  session: Session | None = None) -> RunContext:
    settings = RunSettings.of(cfg)
    if sources is None:
        sources, source_ident = resolve_sources(cfg, store, settings)
    t = cfg.trainer
    n = len(cfg.actor_sources())
    train = load_items(store, taskset, "train")
    evals = load_items(store, taskset, "eval")
    task = Reward(RewardCaller(resolve_reward(cfg.reward.name, cfg.reward.kwargs), cfg.agents.n, cfg.reward.timeout_s,
                               cfg.reward.retries),
                  resolve_processor(cfg.reward.processor), {})
    session = session or Session()
    task.caller.executor = make_executor(cfg.reward.executor, cfg.reward.workers, cfg.reward.executor_address,
                                         cfg.ray)  # fan-out of the task reward's calls (None: serial)
    if task.caller.executor is not None:
        session.closers.append(task.caller.executor.close)
    adapter = None
    if cfg.centralized:  # the joint actor's reward splits its completion into the roles the task reward scores
        adapter = load_adapter(cfg.centralized_adapter, cfg.centralized_adapter_kwargs)
        role0 = role_formatter(cfg.formatter_for(0))
        task = Reward(RewardCaller(CentralizedReward(task.caller, adapter, role0), 1), task.processor, {})
    reward = (Reward(RewardCaller(reward_override[0], n), resolve_processor(None), reward_override[1])
              if reward_override else task)
    ac = settings.actor_critic
    critic_paths, cident = None, None
    if ac and cfg.critic_sources():
        critic_paths, cident = resolve_model_sources(cfg.critic_sources(), settings, store, "critic")
    multi = settings.multi_turn
    joint_mode = t.joint_mode
    episode = Episode(t.num_turns if multi else 1, joint_mode,
                      Transition(cfg.transition.name, cfg.transition.kwargs) if multi else None,
                      t.early_termination_threshold, t.external_prompt_passthrough, t.discount, reward_per_node=ac,
                      expansion=t.tree_expansion if multi else "all")
    hooks = None
    if cfg.eval_logger and cfg.eval_aggregator:
        from coopflow.stages.common.user_code import load_callable

        hooks = (load_callable(cfg.eval_logger, "eval_logger"), load_callable(cfg.eval_aggregator, "eval_aggregator"))
        if adapter is not None:  # the user's logger sees the N role outputs, as in a decentralized run
            hooks = (RoleSplitLogger(hooks[0], adapter, cfg.agents.n), hooks[1])
    per_node = len(joint_combos(t.num_generations, n, joint_mode))
    nodes = budget.tree_size(t.num_generations, n, t.num_turns, joint_mode, episode.expansion)[1]
    # the plan: updates and segments need the tree shape, which the context's helpers compute
    ctx = RunContext(settings=settings, store=store, taskset=taskset, train_items=train, eval_items=evals,
                     sources=sources, reward=reward, task_reward=task,
                     sampling=SamplingConfig.of(settings.rollouts, settings.execution, t.num_generations),
                     eval_sampling=SamplingConfig.of(settings.eval, settings.execution, t.num_generations),
                     episode=episode, plan=RunPlan(start_key(settings, source_ident, cident), (), (),
                                                   budget.Budget(0, 0, 0, 0, 0, 0)),
                     n=n, roles=cfg.agents.n, eval_used=t.eval_num_samples,
                     joint_actions_per_node=per_node, nodes_per_item=nodes,
                     session=session, critic_paths=critic_paths, eval_hooks=hooks, adapter=adapter)
    # MAGRPO's rollout_buffer_size counts tree nodes per agent; the actor-critic trainers count samples per agent.
    units = ctx.nodes_per_item * (t.num_generations if ac else 1)
    updates = plan_updates(len(train), t.num_train_epochs, t.rollout_buffer_size, ctx.joint_actions_per_item(), units)
    est = budget.estimate(len(train), len(ctx.eval_items_used()) * t.eval_samples_per_item, n, t.num_generations, t.num_turns, joint_mode,
                          t.num_train_epochs, len(updates[0].item_ids) if updates else 1, ctx.episode.expansion)
    budget.check(est, cfg.max_sequences)
    warn = budget.unreachable_turns_warning(t.num_turns, t.early_termination_threshold,
                                            processed_range(reward.caller.fn, cfg.reward.reward_range,
                                                            task.processor))
    warns = tuple(w for w in (warn, eval_on_train_warning(cfg, train, ctx.eval_items_used())) if w)
    ctx = ctx.with_plan(updates=tuple(updates),
                        segments=tuple(tuple(s) for s in plan_segments(updates, cfg.checkpoint_every)),
                        budget=est, warnings=warns)
    if not trains_in_segments(cfg):
        return ctx
    ctx = ctx.with_plan(end_keys=segment_end_keys(ctx))
    records = [segment_record_keys(ctx, i) for i in range(len(ctx.end_keys))]
    return ctx.with_plan(steps_keys=tuple(s for s, _ in records), metrics_keys=tuple(m for _, m in records))


def eval_on_train_warning(cfg: RunConfig, train: list[dict], evals: list[dict]) -> str | None:
    """Warn when the evaluation runs on items the run trains on (a taskset without a held-out split)."""
    both = eval_overlap(train, evals)
    if not both:
        return None
    return (f"evaluation runs on training items: {both} of the {len(evals)} eval items of taskset "
            f"{cfg.taskset.name!r} are also trained on, so eval measures fit, not held-out performance; set "
            "taskset.eval_fraction (e.g. 0.2) or taskset.eval_file for held-out eval items")


def processed_range(fn, declared: tuple | None, processor) -> tuple[float, float] | None:
    """The reward's declared (config, else `fn.reward_range`) range mapped through the processor."""
    rng = declared or declared_range(fn)
    if rng is None:
        return None
    ends = [float(processor(float(rng[0]))), float(processor(float(rng[1])))]
    return min(ends), max(ends)


def formatters_for(ctx: RunContext, policies, settings=None) -> list:
    """Per-agent formatter functions (chat templates need the loaded tokenizers), from the formatters of `settings`
    (the calling stage's settings; default: the rollouts')."""
    settings = settings or ctx.settings.rollouts
    toks = policies.tokenizers if policies else [None] * ctx.n
    if ctx.adapter is not None:  # one joint prompt from the role prompts, in the actor's chat template if asked
        return [JointFormatter(ctx.adapter, *joint_prompt_parts(settings, ctx.roles, toks[0]))]
    return [build_formatter(settings.formatter_for(i), toks[i]) for i in range(ctx.n)]


def joint_prompt_parts(cfg, roles: int, tokenizer) -> tuple[list, object]:
    """What a centralized adapter folds into one prompt: each role's prompt as plain text (its system prompt above
    it), and the wrap around the joint prompt: the tokenizer's chat template when formatter 0 asks for one (None
    without a tokenizer)."""
    chat = cfg.formatter_for(0).chat_template and tokenizer is not None
    return ([role_formatter(cfg.formatter_for(i)) for i in range(roles)],
            chat_wrapper(FormatterConfig(chat_template=True), tokenizer) if chat else None)


# --- preference learning: the candidate phase's budget, MARLHF's RL phase ----------------------------


def preference_budget(ctx: RunContext) -> budget.Budget:
    """Counts of the candidate phase (P sequences per agent per item; one generate per agent)."""
    n, items = ctx.n, len(ctx.train_items)
    P = ctx.settings.candidates.trainer.preference_num_candidates
    n_eval = len(ctx.eval_items_used())
    return budget.Budget(updates=0, generate_calls=n, sequences=items * P * n, joint_actions=items * P,
                         reward_calls=items * P, eval_sequences=n_eval * n)


def preference_context(cfg: RunConfig, store: ArtifactStore, taskset: ArtifactRef, session=None) -> RunContext:
    """The run context of MADPO / MARLHF, its plan's budget counting the candidate phase."""
    ctx = make_context(cfg, store, taskset, session=session)
    est = preference_budget(ctx)
    budget.check(est, cfg.max_sequences)
    return ctx.with_plan(budget=est)


def rl_config(cfg: RunConfig) -> RunConfig:
    """The online RL run of a MARLHF config: its rl_algorithm's config, the shared trainer fields mapped over."""
    t = cfg.trainer
    data = cfg.model_dump(mode="json", exclude={"algorithm", "trainer"})
    data["trainer"] = rl_trainer_fields(t, t.rl_algorithm)
    if t.rl_algorithm == "maac" or (t.rl_algorithm == "iac" and t.use_separate_critic):
        data["critic"] = {"critic_model": t.critic_model_name or cfg.agents.sources()[0]}
    return validate_config(data, t.rl_algorithm)


def rl_phase_context(ctx: RunContext, reward: tuple, sources: list[str] | None = None,
                     source_ident: dict | None = None) -> RunContext:
    """The context of MARLHF's RL phase (offline, or one iterative round's): the run's `rl_config`, training on
    `reward` = (reward function, identity) while evaluations keep the task reward, from `sources` (default the
    run's agents; `source_ident` names them in the keys). Shares the run's session."""
    return make_context(rl_config(ctx.settings._config), ctx.store, ctx.taskset, sources, source_ident,
                        reward_override=reward, session=ctx.session)
