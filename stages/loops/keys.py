"""The input-addressed keys of a run's artifacts, chained so every key is known before anything runs.

    policy_0       = key of the start (initial sources, critics and algorithm)
    rollouts_u     = H(policy_u, items of u, sampling, formatters, seed, u [, episode settings])
    advantages_u   = H(rollouts_u, reward identity, joint mode, advantage mode, normalization[, KL, discount])
    ac_samples_u   = H(rollouts_u, reward identity, algorithm, critic type, discount, KL, normalization)
    policy_{u+1}   = H(policy_u, advantages_u | ac_samples_u, learning rates, batch size, seed[, loss])
    scores_u       = H(rollouts_u, reward identity, per-node rewards, joint mode, env_step before u)
    eval           = H(checkpoint, eval items, sampling, task reward, formatters, seed[, episode])

Multi-turn rollouts depend on the reward (early termination, feedback transitions), so their key then
also holds the reward, transition, threshold and turn count. env_step is counted at run time (early
termination makes it data-dependent), which is why only the scores key holds it. A checkpoint is
stored under the key of the policy version it holds.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coopflow.artifacts import key_for
from coopflow.stages.loops.plan import STAGE_VERSION, Update, is_actor_critic
from coopflow.stages.tasks.taskset import items_digest

if TYPE_CHECKING:  # the context imports this module to plan its keys
    from coopflow.stages.loops.context import RunContext


@dataclass(frozen=True)
class UpdateKeys:
    rollouts: str
    advantages: str
    policy_after: str


def scores_key(ctx: "RunContext", rollouts_key: str, env_step_base: int) -> str:
    """Key of the scores of one rollouts artifact under this run's reward and joint mode."""
    return key_for("scores", {"rollouts": rollouts_key, "reward": ctx.reward_id, "per_node": ctx.episode.reward_per_node,
                              "joint_mode": ctx.episode.joint_mode, "env_step_base": env_step_base})


def update_keys(ctx: "RunContext", policy_key: str, u: Update) -> UpdateKeys:
    """The chained artifact keys of one update (see the module docstring)."""
    cfg, t = ctx.cfg, ctx.cfg.trainer
    items = [ctx.train_items[i] for i in u.item_ids]
    fmt = ctx.formatter_ids()
    spec = {"policy": policy_key, "items": items_digest(items), "sampling": ctx.sampling.identity(),
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
    if t.loss_on_padding and ctx.adapter is None:  # the reference's exact loss (pads scored, each row's last token not)
        spec["loss"] = "comlrl-1.4.3"
    if getattr(t, "loss_chunk_tokens", None):  # (absent otherwise: keys stay as they were) other float sums, other weights
        spec["chunk_tokens"] = t.loss_chunk_tokens
    return UpdateKeys(rk, ak, key_for("policy", spec))


def eval_key(ctx: "RunContext", ckpt_key: str) -> str:
    """Key of the final evaluation artifact of a checkpoint."""
    t = ctx.cfg.trainer
    items = ctx.eval_items_used()
    fmt = ctx.formatter_ids()
    spec = {"checkpoint": ckpt_key, "items": items_digest(items), "sampling": ctx.sampling.identity(),
            "reward": ctx.eval_reward()[2], "formatters": fmt, "seed": ctx.cfg.seed}
    if t.eval_samples_per_item > 1:
        spec["samples_per_item"] = t.eval_samples_per_item
    if t.num_turns > 1:
        spec["episode"] = {"turns": t.num_turns, "transition": ctx.transition_id, "discount": t.discount,
                           "passthrough": t.external_prompt_passthrough}
    return key_for("eval", spec)




def segment_end_keys(ctx: "RunContext") -> tuple[str, ...]:
    """Checkpoint key (= policy version key) at the end of every segment of the plan, before anything runs."""
    out, pk = [], ctx.plan.start_key
    for seg in ctx.plan.segments:
        for u in seg:
            pk = update_keys(ctx, pk, u).policy_after
        out.append(pk)
    return tuple(out)


ROUND_STAGE_VERSION = "1"
"""Stage version of the iterative rounds' keys (`stages.loops.rounds`), apart from the segment loop's."""


def rm_round_key(round_key: str) -> str:
    """Key of the reward model fitted in the iterative round whose checkpoint key is `round_key`."""
    return key_for("reward_model", {"round": round_key, "v": ROUND_STAGE_VERSION})
