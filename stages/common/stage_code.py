"""The code of coopflow that computes each artifact kind, declared once, and its digest for the kind's keys.

Keys (`coopflow.stages.planning.keys`) hold a digest of the code that computed an artifact, so that an edit of
coopflow's own stages can never serve a result the old code computed. `CODE` names, per kind, the modules that
compute it; `kind_code(kind)` is the digest of their closure (`code_identity.code_digest`). Orchestration modules
(the loops, the planning) count as their own text only, since they import every stage.
"""

from coopflow.stages.common.code_identity import code_digest

_S = "coopflow.stages."
_GENERATE = (_S + "rollout.tree", _S + "rollout.generate", _S + "agents.decode", _S + "agents.workers",
             _S + "tasks.formatters", _S + "tasks.transitions", _S + "tasks.centralized", _S + "planning.context")
_LOAD = (_S + "agents.models", _S + "agents.lora", _S + "agents.spec", _S + "agents.state", _S + "agents.value_heads",
         _S + "agents.checkpoint", _S + "agents.catalog")

CODE: dict[str, tuple[str, ...]] = {
    "model": (_S + "agents.models",),  # the tiny model built locally
    "taskset": (_S + "tasks.taskset",),
    "start": _LOAD,
    "rollouts": (_S + "loops.segment", _S + "loops.actor_critic", *_GENERATE),
    "scores": (_S + "loops.segment", _S + "score.scores", _S + "score.rewards", _S + "tasks.centralized"),
    "advantages": (_S + "loops.segment", _S + "score.advantages"),
    "ac_samples": (_S + "loops.segment", _S + "loops.actor_critic", _S + "score.ac_targets", _S + "fit.critic"),
    "policy": (_S + "loops.segment", _S + "loops.actor_critic", _S + "update.policy_gradient",
               _S + "update.actor_critic", _S + "fit.critic", _S + "agents.logprobs", _S + "agents.reference_kl",
               *_LOAD),
    "steps": (_S + "loops.segment",),
    "metrics": (_S + "loops.segment", _S + "loops.run", _S + "evaluate.evaluate", _S + "score.advantages",
                *_GENERATE),
    "eval": (_S + "loops.run", _S + "evaluate.evaluate", _S + "score.scores", _S + "score.rewards", *_GENERATE),
    "critic": (_S + "loops.run", _S + "fit.critic", *_LOAD),
    "candidates": (_S + "loops.preference", *_GENERATE),
    "pairs": (_S + "loops.preference", _S + "score.pairs"),
    "dpo": (_S + "loops.preference", _S + "update.dpo", *_LOAD),
    "reward_model": (_S + "loops.preference", _S + "fit.reward_model"),
    "round": (_S + "loops.rounds", _S + "loops.preference", _S + "update.dpo", _S + "fit.reward_model",
              _S + "score.pairs", _S + "score.replay", _S + "score.scores", _S + "score.rewards",
              _S + "rollout.coordinator", _S + "rollout.comparator_api", _S + "evaluate.reward_drift",
              _S + "evaluate.evaluate", *_GENERATE, *_LOAD),
}
"""The modules of coopflow that compute each artifact kind. The digest of their code and of everything they import
(`coopflow.stages.common.code_identity`: comments and docstrings do not count; the loops' and the planning's own
code counts, not what they import) is part of every key of that kind, so an edit of a stage recomputes the
artifacts it computes (and, through the chained keys, what depends on them), never anything else."""


def kind_code(kind: str) -> str:
    """Digest of the code that computes artifacts of `kind` (see `CODE`)."""
    return code_digest(CODE[kind])
