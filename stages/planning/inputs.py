"""What each artifact's content depends on, declared once: the config fields that enter its key.

Every artifact is stored under a key computed before anything runs (`coopflow.stages.planning.keys`): a hash of
its upstream keys (the policy it was sampled from, the rollouts it scores, ...), of identities derived from
code (a reward function's source, a model directory's files, the items' digest) and of the config fields
declared here for its kind. A config field changes an artifact only through a key that holds it, so each
field is either

- an input of one or more kinds (`INPUTS`): its value is part of those kinds' keys, and through the chain
  of keys part of everything downstream (a rollouts input changes the scores, advantages, policies and
  evaluations after it too); a declared path covers the fields under it (`agents.lora` = every LoRA field);
- or listed in `NO_EFFECT` with the reason it changes no stored content: where or how fast a stage runs
  (threads, devices, worker processes, executors), what is tracked or printed, limits that stop a run
  rather than change what it stores, and options that only select what a run does next.

`tests/test_key_inputs.py` walks every field of every config model: an unclassified field fails it, each
input must change the keys of its kinds, and tiny runs check that no field changes the content stored
under an unchanged key (the stale hit this module exists to rule out).

Keys hold *what is computed*, not how fast: thread counts, worker processes, Ray actors and executors are
execution settings (one torch thread per agent computes the same numbers in process and in workers; tested),
while a setting that changes the numbers computed (weight or matmul dtype, the attention kernel, the device,
sampling, learning rates, loss variants) is an input.
"""

from typing import Any

from pydantic import BaseModel

# --- inputs of each artifact kind ---------------------------------------------------------------------

INPUTS: dict[str, tuple[str, ...]] = {
    # the policies a run starts from (its first policy key): which weights, in which dtype, which critics
    # (the attention kernel and the device change the numbers computed, and a GPU samples other tokens than a CPU
    # for the same seed: they are inputs, unlike thread counts and worker placement)
    "start": ("algorithm", "seed", "agents.agent_model", "agents.agents", "agents.num_agents", "agents.dtype",
              "agents.compute_dtype", "agents.attn_implementation", "agents.device", "agents.lora",
              "agents.tiny_hidden_size", "agents.tiny_num_layers",
              "trainer.collaboration_mode", "centralized_adapter", "centralized_adapter_kwargs",
              "critic.critic_model", "critic.critics", "trainer.use_separate_critic", "trainer.critic_type",
              "trainer.value_head_hidden_dim", "trainer.critic_value_head_hidden_dim", "cache_salt"),
    # a tiny model built into the store (agent source 'tiny')
    "model": ("agents.tiny_hidden_size", "agents.tiny_num_layers"),
    # the plan: which items each update trains on. Never hashed as such (no key function reads this entry): it
    # reaches the keys through each update's items and index, so a run continued with more epochs reuses the
    # shorter run's artifacts
    "plan": ("trainer.rollout_buffer_size", "trainer.num_train_epochs", "checkpoint_every", "trainer.num_iterations"),
    # one update's samples: sampling settings and prompts ...
    "rollouts": ("seed", "formatters", "trainer.num_generations", "trainer.max_new_tokens", "trainer.temperature",
                 "trainer.top_p", "trainer.top_k", "agents.generation_backend", "agents.prompt_overflow",
                 "agents.compute_dtype", "trainer.num_turns", "trainer.reference_kl_enabled"),
    # ... and, for multi-turn trees only, the episode's rules: which branches continue and what later turns see
    # depend on the reward (a single-turn run's samples do not: a new reward reuses them)
    "episode": ("transition", "reward.name", "reward.kwargs", "reward.processor", "trainer.joint_mode",
                "trainer.early_termination_threshold", "trainer.external_prompt_passthrough", "trainer.tree_expansion"),
    # the reward of every joint action of those samples
    "scores": ("reward.name", "reward.kwargs", "reward.processor", "trainer.joint_mode", "algorithm"),
    # MAGRPO family: returns and group-baseline advantages
    "advantages": ("reward.name", "reward.kwargs", "reward.processor", "trainer.joint_mode", "trainer.advantage_mode",
                   "trainer.advantage_normalization", "trainer.advantage_normalization_scope",
                   "trainer.tree_expansion", "trainer.team_reward_weight",
                   "trainer.reference_kl_enabled", "trainer.reference_kl_coef",
                   "trainer.discount", "algorithm"),
    # IAC / MAAC: value targets and advantages from the critic
    "ac_samples": ("reward.name", "reward.kwargs", "reward.processor", "algorithm", "trainer.critic_type",
                   "trainer.discount", "trainer.reference_kl_enabled", "trainer.reference_kl_coef",
                   "trainer.advantage_normalization"),
    # the policy after one update (its weights and optimizer state)
    "policy": ("seed", "trainer.agent_learning_rate", "trainer.train_batch_size", "trainer.rollout_buffer_size", "trainer.loss_on_padding",
               "trainer.num_policy_epochs", "trainer.clip_range", "trainer.ratio_level",
               "trainer.loss_chunk_tokens", "trainer.critic_learning_rate", "trainer.value_loss_coef",
               "trainer.value_clip_range"),
    # a segment's metric rows: what is logged, how often, and the periodic evaluations' settings
    "metrics": ("trainer.logging_steps", "trainer.eval_interval", "trainer.eval_num_samples",
                "trainer.eval_samples_per_item", "metrics_callback", "eval_logger", "eval_aggregator",
                "reward.name", "reward.kwargs", "reward.processor"),
    # the final evaluation of a checkpoint
    "eval": ("seed", "formatters", "trainer.eval_num_samples", "trainer.eval_samples_per_item",
             "trainer.num_generations", "trainer.max_new_tokens", "trainer.temperature", "trainer.top_p",
             "trainer.top_k", "agents.generation_backend", "agents.prompt_overflow", "agents.compute_dtype",
             "trainer.num_turns", "transition", "trainer.discount", "trainer.external_prompt_passthrough",
             "reward.name", "reward.kwargs", "reward.processor"),
    # the re-fitted critics (`stages=['critic']`)
    "critic": ("seed", "critic.refit_epochs", "critic.refit_learning_rate", "trainer.critic_learning_rate",
               "trainer.train_batch_size", "trainer.rollout_buffer_size"),
    # the task items (built-in, file or dataset; the source's content digest joins them in the key)
    "taskset": ("taskset",),
    # MADPO / MARLHF: the candidates sampled from the start policies, their pairs, DPO, the reward model
    "candidates": ("seed", "formatters", "trainer.preference_num_candidates", "trainer.max_new_tokens",
                   "trainer.temperature", "trainer.top_p", "trainer.top_k", "agents.generation_backend",
                   "agents.prompt_overflow", "agents.compute_dtype"),
    "pairs": ("seed", "trainer.pair_selection", "trainer.preference_pairs_per_sample"),
    # (rollout_buffer_size: the batch size when train_batch_size is null, as in CoMLRL)
    "dpo": ("seed", "trainer.dpo_beta", "trainer.agent_learning_rate", "trainer.num_train_epochs",
            "trainer.train_batch_size", "trainer.rollout_buffer_size", "trainer.use_environment_step",
            "trainer.environment_steps_per_pair"),
    "reward_model": ("seed", "agents.dtype", "trainer.reward_model_name", "trainer.reward_learning_rate",
                     "trainer.reward_num_train_epochs", "trainer.reward_train_batch_size", "trainer.reward_max_length",
                     "trainer.reward_freeze_backbone"),
    # MARLHF's RL phase runs a config of its own (`rl_trainer_fields`): these become its algorithm and critic
    # sources (start inputs there); the fields both trainers share are copied and enter that config's keys.
    # Never hashed as such, like the plan
    "rl_phase": ("trainer.rl_algorithm", "trainer.critic_model_name"),
    # an iterative round (its checkpoint, pairs shard, reward model and metrics): every trainer setting but those
    # in NO_EFFECT, and what its candidates, evaluation and logging read
    # (a path with a leading '-' is left out of a declared section: the round count is the plan of the rounds)
    "round": ("trainer", "-trainer.num_iterations", "seed", "formatters", "transition", "agents.generation_backend",
              "agents.prompt_overflow", "agents.compute_dtype", "eval_logger", "eval_aggregator", "metrics_callback",
              "reward.name", "reward.kwargs", "reward.processor", "reward.reward_range"),
}
"""Config fields each kind's key holds. Upstream keys and code/data identities are added by the key functions."""


# --- fields that change no stored content, and why ----------------------------------------------------

_EXECUTION = "where or how fast the same computation runs (float rounding at most), not what it computes"
_TRACKING = "what is tracked, named or printed; stored artifacts are the same"
_LIMIT = "a limit or check: exceeding it stops the run with an error, it never changes what is stored"
_STORE = "where artifacts are stored, not what they hold"

NO_EFFECT: dict[str, str] = {
    "agents.decode_step": _EXECUTION + " (every step mode draws the same tokens; tested)",
    "agents.torch_threads": _EXECUTION,
    "trainer.parallel_training": _EXECUTION,
    "trainer.agent_devices": _EXECUTION,
    "trainer.critic_devices": _EXECUTION,
    "trainer.reference_devices": _EXECUTION,
    "trainer.eval_batch_size": _EXECUTION + " (kept for CoMLRL compatibility; evaluation is batched)",
    "reward.executor": _EXECUTION,
    "reward.workers": _EXECUTION,
    "reward.executor_address": _EXECUTION,
    "ray.address": _EXECUTION,
    "ray.local_num_cpus": _EXECUTION,
    "ray.num_cpus_per_agent": _EXECUTION,
    "ray.num_gpus_per_agent": _EXECUTION,
    "ray.object_store_mb": _EXECUTION,
    "reward.timeout_s": _LIMIT,
    "reward.retries": "a failed call is retried and the run fails if it keeps failing; a score is the same",
    "reward.reward_range": "only warns when later turns are unreachable and checks processed values' range (an "
                           "iterative round's reward-drift records use it: a round input there)",
    "max_sequences": _LIMIT,
    "check_disk": _LIMIT,
    "sandbox.require_isolation": _LIMIT,
    "tracking.enabled": _TRACKING,
    "tracking.experiment": _TRACKING,
    "tracking.run_name": _TRACKING,
    "tracking.tracking_uri": _TRACKING,
    "tracking.rollouts": _TRACKING + " (which joint answers are copied to MLflow as tables)",
    "env": "names where taskset, reward, formatters, transition and eval hooks came from; those parts, expanded "
           "into the config before validation, are the inputs",
    "data_dir": _STORE,
    "remote_store": _STORE,
    "remote_store_options": _STORE,
    "eval_before": "selects an extra evaluation of the start policies (stored under its own eval key)",
    "checkpoint_write": _EXECUTION + " (the same checkpoint files, written beside the next phase or before it; tested)",
    "checkpoint_optimizer": "slims stored checkpoints to weights only once not needed; a run that needs the dropped "
                            "optimizer state replays its stored rollouts to rebuild it",
    "trainer.num_agents": "validated equal to agents.num_agents, which is the input",
    "trainer.reward_model_device": _EXECUTION,
    "trainer.comparator_devices": _EXECUTION,
    "trainer.comparator_api_key": "a credential (never stored or hashed); which service answers is the url and model",
    "trainer.comparator_api_key_env": "names where the credential is read from",
    "trainer.comparator_api_timeout": _LIMIT,
    "trainer.comparator_api_retries": "a failed request is retried; the answer a round keeps is the same",
    "trainer.preference_replay_dir": "exports each round's pairs as JSON outside the store; the store is the same",
    "trainer.policy_checkpoint_dir": "exports each round's policies outside the store; the store is the same",
}


NOT_READ: dict[str, tuple[tuple[str, ...], str]] = {
    "madpo": (("trainer.advantage_mode", "trainer.advantage_normalization", "trainer.advantage_normalization_scope",
               "trainer.early_termination_threshold", "trainer.num_policy_epochs", "trainer.clip_range",
               "trainer.ratio_level", "trainer.tree_expansion", "trainer.team_reward_weight",
               "trainer.loss_chunk_tokens", "trainer.loss_on_padding", "trainer.reference_kl_coef",
               "trainer.reference_kl_enabled", "checkpoint_every", "checkpoint_write"),
              "MADPO trains by DPO on its pairs: these MAGRPO settings of CoMLRL's MADPOConfig are accepted, not read"),
    "marlhf": (("trainer.dpo_beta", "trainer.use_environment_step", "trainer.environment_steps_per_pair"),
               "MARLHF fits a reward model and runs RL on it: the DPO settings its config inherits are not read"),
    "madpo-iter": (("checkpoint_every", "checkpoint_write"),
                   "a round trains by DPO in one piece: there are no segments to checkpoint"),
}
"""Fields an algorithm's config accepts (for CoMLRL compatibility) but its run never reads."""


# --- fields that name code ---------------------------------------------------------------------------

CODE_FIELDS: tuple[str, ...] = ("reward.name", "reward.processor", "transition.name", "formatters", "eval_logger",
                                "eval_aggregator", "metrics_callback", "centralized_adapter")
"""Config fields that name code (a built-in name or an import path 'module:function'). Wherever a kind declares
one (directly or through its section), the kind's key holds, beside the name, the digest of the code it names:
its module and every module of the user's own that module imports (`code_identity.callable_identity`), so an
edit of a formatter, a reward's helper or another module of the user's package recomputes what depends on it."""


def code_of(cfg: BaseModel, path: str):
    """Digest of the code config field `path` names (None when it names none: an unset hook, a template
    formatter). Raises ValueError when the code cannot be imported (pre-flight reports that first)."""
    from coopflow.stages.common.code_identity import callable_identity
    from coopflow.stages.common.user_code import load_callable

    found, value = _lookup(cfg, path)
    if not found:
        return None
    if path == "reward.name":
        from coopflow.stages.score.rewards import BUILTIN_REWARDS

        return callable_identity(BUILTIN_REWARDS.get(value) or load_callable(value, "reward"))
    if path == "reward.processor":
        from coopflow.stages.score.rewards import resolve_processor

        return callable_identity(resolve_processor(value))
    if path == "transition.name":
        from coopflow.stages.tasks.transitions import BUILTIN_TRANSITIONS

        return None if value is None else callable_identity(BUILTIN_TRANSITIONS.get(value) or
                                                            load_callable(value, "transition"))
    if path == "formatters":
        fmts = value if isinstance(value, list) else [value] if value else []
        fns = [f.function if isinstance(f, BaseModel) else f.get("function") for f in fmts]
        return [callable_identity(load_callable(fn, "formatter")) if fn else None for fn in fns]
    if path == "centralized_adapter":
        from coopflow.stages.tasks.centralized import adapter_identity

        return None if value is None else adapter_identity(value, cfg.centralized_adapter_kwargs)["code"]
    return None if value is None else callable_identity(load_callable(value, path))


# --- reading the declared values of a config ----------------------------------------------------------


def covers(declared: str, path: str) -> bool:
    """Whether declared path `declared` covers field `path` (itself, or a model field under it)."""
    return path == declared or path.startswith(declared + ".")


def left_out_of(kind: str) -> set[str]:
    """Paths `INPUTS[kind]` leaves out of its declared sections ('-' entries)."""
    return {p[1:] for p in INPUTS[kind] if p.startswith("-")}


def kinds_of(path: str) -> list[str]:
    """The kinds whose declared inputs hold field `path` (directly or in a declared section it is not left out of)."""
    return [kind for kind, paths in INPUTS.items()
            if any(covers(p, path) for p in paths if not p.startswith("-"))
            and not any(covers(p, path) for p in left_out_of(kind))]


def declared_values(cfg: BaseModel, kind: str) -> dict[str, Any]:
    """{path: JSON value} of the fields `INPUTS[kind]` declares that this config's models have (the trainer of
    one algorithm lacks another's fields); what goes into the kind's key besides its upstream keys. A declared
    section (`trainer`) holds its fields minus those in `NO_EFFECT`."""
    out = {}
    left_out = left_out_of(kind) | set(NO_EFFECT)
    for path in INPUTS[kind]:
        found, value = (False, None) if path.startswith("-") else _lookup(cfg, path)
        if found:
            out[path] = _without(path, value, left_out)
    for field in CODE_FIELDS:  # the code a declared field names, beside its name
        if any(covers(p, field) for p in INPUTS[kind] if not p.startswith("-")) and field not in left_out:
            code = code_of(cfg, field)
            if code is not None:
                out[f"code:{field}"] = code
    return out


def _without(path: str, value: Any, left_out: set[str]) -> Any:
    """A declared section's value without the fields under it that are left out."""
    if not isinstance(value, dict) or not any(covers(path, p) for p in left_out):
        return value
    return {k: _without(f"{path}.{k}", v, left_out) for k, v in value.items() if f"{path}.{k}" not in left_out}


def has_field(cfg: BaseModel, path: str) -> bool:
    """Whether config `cfg`'s models have field `path` (the trainer of one algorithm lacks another's fields; a field
    under an optional section that is not set counts as present)."""
    return _lookup(cfg, path)[0]


def _lookup(obj: Any, path: str) -> tuple[bool, Any]:
    for name in path.split("."):
        if obj is None:  # an optional section that is not set (e.g. agents.lora: null): its fields are None
            return True, None
        if not isinstance(obj, BaseModel) or name not in type(obj).model_fields:
            return False, None
        obj = getattr(obj, name)
    # (a section as a dict, so `_without` can drop fields from it; key_for's canonical JSON does the rest)
    return True, obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
