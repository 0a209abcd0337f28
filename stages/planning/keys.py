"""Every input-addressed key of coopflow's artifacts, chained so every key is known before anything runs.

    model          = H(model inputs)                                           (the tiny built-in model)
    policy_0       = H(initial sources' identities, start inputs)
    rollouts_u     = H(policy_u, items of u, u, rollouts inputs [, multi-turn: episode inputs, training reward])
    scores_u       = H(rollouts_u, training reward, env_step before u, scores inputs)
    advantages_u   = H(rollouts_u, training reward, advantages inputs)          (MAGRPO family)
    ac_samples_u   = H(rollouts_u, training reward, ac_samples inputs)          (IAC / MAAC)
    policy_{u+1}   = H(policy_u, advantages_u | ac_samples_u, policy inputs)
    steps_s        = <end key of segment s>-s<H(start and end keys of s)>
    metrics_s      = <steps_s>-m<H(eval items, metrics inputs)>
    eval           = H(checkpoint, eval items, eval inputs)
    critic         = H(checkpoint, ac_samples keys, critic inputs)              (re-fit)
    candidates     = H(policy_0, items, candidates inputs)                      (MADPO, MARLHF)
    scores         = H(candidates, training reward, scores inputs)
    pairs          = H(scores, pairs inputs)
    dpo policy     = H(policy_0, pairs, dpo inputs)                             (MADPO)
    reward model   = H(pairs, backbone identity, reward_model inputs)           (MARLHF)
    round_r        = H(round_{r-1}, r, items, eval items, training reward, round inputs)  (iterative)

"<kind> inputs" are `RunSettings.declared[kind]` (`coopflow.stages.planning.settings`): the config fields
`inputs.INPUTS` declares for that kind, with the digest of the code each field names (a reward, a formatter, ...);
the stage computing the kind reads exactly those and its upstream kinds' (its settings view), never the config.
Every key also holds the digest of coopflow's code that computes its kind (`coopflow.stages.common.stage_code`).
The other parts come from data: the items' digest, a model directory's files, and the training reward's identity
when it is not the task reward (MARLHF's RL phase: the reward model's key; empty otherwise, the task reward being
declared inputs). env_step is counted at run time (early termination makes it data-dependent), which is why only
the scores key holds it. A checkpoint is stored under the key of the policy version it holds; a segment's steps
and metrics under keys that start with it (so `coopflow gc` keeps them with it), the steps key naming where the
segment started (two segmentations of one run share checkpoints, never step lists). The taskset's key is
`stages.tasks.taskset.taskset_key` (a lower room: the taskset is built before any context exists).
"""

from dataclasses import dataclass
from typing import Any, Protocol

from coopflow.artifacts import key_for
from coopflow.stages.common.stage_code import kind_code
from coopflow.stages.planning.plan import Update
from coopflow.stages.tasks.taskset import items_digest


class KeyContext(Protocol):
    """What the key functions read of a run's context (`coopflow.stages.planning.context.RunContext` is one):
    the declared settings, the items, the plan and the identities derived from code and data."""

    settings: Any  # stages.planning.settings.RunSettings
    train_items: list[dict]
    plan: Any
    adapter: object | None
    n: int

    @property
    def reward_id(self) -> dict: ...

    @property
    def end_keys(self) -> tuple[str, ...]: ...

    def eval_reward(self) -> tuple: ...

    def eval_items_used(self) -> list[dict]: ...


@dataclass(frozen=True)
class UpdateKeys:
    rollouts: str
    advantages: str
    policy_after: str


def declared_key(kind: str, store_kind: str, settings, upstream: dict) -> str:
    """The key of an artifact of `store_kind`: its upstream keys and identities, the settings declared as inputs of
    `kind` (`settings.declared[kind]`: the config fields `inputs.INPUTS[kind]` names, with the code digest of those
    that name code) and the digest of coopflow's code that computes `kind` (`stage_code.CODE`)."""
    return key_for(store_kind, {"in": upstream, "cfg": dict(settings.declared[kind]), "code": kind_code(kind)})


def start_key(settings, source_ident: dict, critic_ident: list | None) -> str:
    """Key of the policies a run starts from (the first policy version)."""
    return declared_key("start", "policy", settings, {"init": source_ident, "critics": critic_ident})


def scores_key(ctx: KeyContext, rollouts_key: str, env_step_base: int) -> str:
    """Key of the scores of one rollouts artifact under this run's reward and joint mode."""
    return declared_key("scores", "scores", ctx.settings, {"rollouts": rollouts_key, "reward": ctx.reward_id,
                                                           "env_step_base": env_step_base})


def update_keys(ctx: KeyContext, policy_key: str, u: Update) -> UpdateKeys:
    """The chained artifact keys of one update (see the module docstring)."""
    s = ctx.settings
    items = [ctx.train_items[i] for i in u.item_ids]
    upstream = {"policy": policy_key, "items": items_digest(items), "update": u.index}
    if s.multi_turn:  # a tree's shape and later prompts depend on the reward and the transition
        upstream["episode"] = {"cfg": dict(s.declared["episode"]), "reward": ctx.reward_id}
    rk = declared_key("rollouts", "rollouts", s, upstream)
    if s.actor_critic:
        ak = declared_key("ac_samples", "ac_samples", s, {"rollouts": rk, "reward": ctx.reward_id})
        signal = {"ac_samples": ak}
    else:
        ak = declared_key("advantages", "advantages", s, {"rollouts": rk, "reward": ctx.reward_id})
        signal = {"advantages": ak}
    return UpdateKeys(rk, ak, declared_key("policy", "policy", s, {"prev": policy_key, **signal}))


def segment_record_keys(ctx: KeyContext, index: int) -> tuple[str, str]:
    """(steps key, metrics key) of segment `index` of the plan (see the module docstring)."""
    end = ctx.end_keys[index]
    start = ctx.end_keys[index - 1] if index else ctx.plan.start_key
    steps = f"{end}-s{key_for('steps', {'start': start, 'end': end, 'code': kind_code('steps')})[:12]}"
    return steps, metrics_key(ctx, steps)


def metrics_key(ctx: KeyContext, record_key: str) -> str:
    """Key of the metric rows stored beside `record_key` (a segment's steps, a DPO run, a round). A segment whose
    metrics code changed replays its stored updates once to log the new metrics (no generation)."""
    upstream = {"of": record_key, "eval_reward": ctx.eval_reward()[2], "eval_items": items_digest(ctx.eval_items_used())}
    m = declared_key("metrics", "metrics", ctx.settings, upstream)
    return f"{record_key}-m{m[:12]}"


def periodic_eval_key(metrics_key: str, update: int) -> str:
    """Key of the periodic evaluation (`eval_interval`) run before update `update`, stored beside the metrics of its
    segment (the metrics key holds every setting of those evaluations; `coopflow gc` keeps it with the segment)."""
    return f"{metrics_key}-e{update}"


def eval_key(ctx: KeyContext, ckpt_key: str) -> str:
    """Key of the final evaluation artifact of a checkpoint."""
    return declared_key("eval", "eval", ctx.settings, {
        "checkpoint": ckpt_key, "items": items_digest(ctx.eval_items_used()), "reward": ctx.eval_reward()[2]})


def critic_refit_key(ctx: KeyContext, policy_key: str, ac_sample_keys: list[str]) -> str:
    """Key of the critics re-fitted on a run's stored actor-critic samples."""
    return declared_key("critic", "critic", ctx.settings, {"checkpoint": policy_key, "samples": ac_sample_keys})


def segment_end_keys(ctx: KeyContext) -> tuple[str, ...]:
    """Checkpoint key (= policy version key) at the end of every segment of the plan, before anything runs."""
    out, pk = [], ctx.plan.start_key
    for seg in ctx.plan.segments:
        for u in seg:
            pk = update_keys(ctx, pk, u).policy_after
        out.append(pk)
    return tuple(out)


def rm_round_key(round_key: str) -> str:
    """Key of the reward model fitted in the iterative round whose checkpoint key is `round_key` (which holds the
    rounds' code digest)."""
    return key_for("reward_model", {"round": round_key})


# --- preference learning (MADPO, MARLHF) and iterative rounds ---------------------------------------------


def candidates_key(ctx: KeyContext) -> str:
    """Key of the P candidates per item sampled from the start policies (a `rollouts` artifact)."""
    return declared_key("candidates", "rollouts", ctx.settings, {
        "start": ctx.plan.start_key, "items": items_digest(ctx.train_items)})


def preference_scores_key(ctx: KeyContext) -> str:
    """Key of the candidates' task-reward scores."""
    return declared_key("scores", "scores", ctx.settings, {"candidates": candidates_key(ctx),
                                                           "reward": ctx.reward_id})


def pairs_key(ctx: KeyContext) -> str:
    """Key of the preference pairs built from the scored candidates."""
    return declared_key("pairs", "pairs", ctx.settings, {"scores": preference_scores_key(ctx)})


def dpo_key(ctx: KeyContext) -> str:
    """Key of MADPO's policy after DPO on the pairs."""
    return declared_key("dpo", "policy", ctx.settings, {"init": ctx.plan.start_key, "pairs": pairs_key(ctx)})


def reward_model_key(ctx: KeyContext, backbone: list[dict]) -> str:
    """Key of MARLHF's reward model fitted on the pairs, from a backbone of identity `backbone`."""
    return declared_key("reward_model", "reward_model", ctx.settings, {"pairs": pairs_key(ctx),
                                                                       "backbone": backbone})


def round_keys(ctx: KeyContext) -> list[str]:
    """Checkpoint key of every round 1..num_iterations of an iterative run (computable before anything runs)."""
    out, prev = [], ctx.plan.start_key
    for r in range(1, ctx.settings.plan.trainer.num_iterations + 1):
        prev = declared_key("round", "checkpoint", ctx.settings, {
            "prev": prev, "round": r, "items": items_digest(ctx.train_items),
            "eval_items": items_digest(ctx.eval_items_used()), "reward": ctx.reward_id})
        out.append(prev)
    return out
