"""The `trainer` section of the MAGRPO family and the actor-critic algorithms: CoMLRL 1.4.3's MAGRPOConfig (and
its MAREINFORCE / MARLOO / MAReMax / centralized variants), IACConfig and MAACConfig, field for field.

`_TrainerBase` holds the fields every trainer has; `_CriticFields` / `_IACFields` are field sets (no trainer
fields of their own) that the actor-critic configs, and MARLHF for its maac/iac backend, put in front of their one
trainer base. A subclass re-declares an inherited field only through `_override`."""

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from coopflow.schemas.config.common import (COLLABORATION_ALIASES, JOINT_MODE_ALIASES, _alias, _override,
                                            _Strict)


def parallel_mode(v: str | None) -> str:
    """none | mp | ray (None/'null' mean none; 'auto' and anything else are refused, as in the reference, which
    has no 'ray')."""
    v = "none" if v is None or str(v).lower() in ("none", "null") else str(v).lower()
    if v not in ("none", "mp", "ray"):
        raise ValueError(f"parallel_training must be 'none', 'mp' or 'ray', got {v!r}")
    return v


class _TrainerBase(_Strict):
    """The fields every trainer config has, with `MAGRPOConfig`'s defaults (the actor-critic configs override a
    few defaults; the MAGRPO family narrows num_generations to >= 2)."""

    num_train_epochs: int = Field(20, ge=1, description="Passes over the training items.")
    agent_learning_rate: float = Field(5e-6, gt=0, description="AdamW learning rate of every agent (actor).")
    logging_steps: int = Field(50, ge=1, description="Minimum env_step gap between two training metric logs.")
    num_agents: int | None = Field(2, ge=1, description="Alias of agents.num_agents (must agree when set explicitly; "
                                                         "a run config keeps it equal to agents.num_agents).")
    parallel_training: str | None = Field(
        "none", description="none (agents in this process) | mp (one persistent worker process per agent; "
                            "generate and update run concurrently; needs agent_devices, and critic_devices for "
                            "critic models) | ray (one Ray actor per agent, placed by Ray on any node of the `ray` "
                            "section's cluster with its num_cpus/num_gpus_per_agent; coopflow's extension).")
    agent_devices: str | list[str] | None = Field(
        None, description="Device per agent for mp ('cpu', 'cuda:0', ...); a single value is broadcast.")
    num_generations: int = Field(4, ge=1, description="K samples per agent per prompt (the MAGRPO family needs >= 2 "
                                                      "for its group baseline; multi-turn actor-critic needs 1).")
    max_new_tokens: int = Field(256, ge=1, description="Maximum generated tokens per completion.")
    temperature: float = Field(0.6, gt=0, description="Sampling temperature.")
    top_p: float = Field(0.6, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int | None = Field(50, ge=0, description="Top-k sampling; null (or 0) disables top-k entirely.")
    num_turns: int = Field(2, ge=1, description="Turns per episode H; > 1 needs a transition (multi-turn; "
                                                "actor-critic: and num_generations 1).")
    discount: float = Field(1.0, ge=0, le=1, description="gamma of the returns: MAGRPO family reward + gamma * "
                                                         "mean(child returns) (1.0 = undiscounted); actor-critic "
                                                         "TD(0) targets and the logged MC returns.")
    early_termination_threshold: float | None = Field(
        -0.2, description="Stop a branch (actor-critic: an episode) when its turn's mean reward exceeds this "
                          "(multi-turn only); null disables.")
    external_prompt_passthrough: bool = Field(False, description="Pass transition prompts to formatters unchanged.")
    eval_interval: int = Field(16, ge=0, description="Evaluate every this many training items (0 = off).")
    eval_num_samples: int = Field(4, ge=0, description="Eval items per evaluation.")
    eval_samples_per_item: int = Field(
        1, ge=1, description="Sampled paths per eval item (1 = the reference's single path); n > 1 gives the "
                             "evaluation hooks n answers per item (the coding environment's pass@k, k <= n).")
    eval_batch_size: int = Field(1, ge=1, description="Eval batch size (kept for compatibility; eval is batched).")
    rollout_buffer_size: int = Field(2, ge=1, description="Samples (MAGRPO family: node samples) per agent collected "
                                                          "before one update.")
    train_batch_size: int | None = Field(None, ge=1, description="Minibatch size in samples; null = "
                                                                 "rollout_buffer_size.")
    advantage_normalization: bool = Field(True, description="z-normalize advantages over each group (MAGRPO family: "
                                                            "a node's samples, population std; actor-critic: an "
                                                            "update's).")
    reference_kl_enabled: bool = Field(
        False, description="Subtract coef x k3-KL to a frozen copy of each agent's initial model from its returns "
                           "(actor-critic: its rewards).")
    reference_kl_coef: float = Field(0.1, ge=0, description="KL penalty coefficient.")
    reference_devices: str | list[str] | None = Field(
        None, description="Devices of the reference models (one, or one per agent); null = the agents' devices.")

    @field_validator("parallel_training")
    @classmethod
    def _parallel(cls, v: str | None) -> str:
        return parallel_mode(v)

    @model_validator(mode="after")
    def _derived(self) -> "_TrainerBase":
        rdev = self.reference_devices
        if isinstance(rdev, list) and "num_agents" in self.model_fields_set and self.num_agents is not None \
                and len(rdev) not in (1, self.num_agents):
            raise ValueError(f"reference_devices length ({len(rdev)}) must be 1 or {self.num_agents}.")
        if self.train_batch_size is None:  # the reference fills it in: full-batch updates
            self.train_batch_size = self.rollout_buffer_size
        return self

    @property
    def batch_size(self) -> int:
        """Resolved train_batch_size (defaults to rollout_buffer_size: full-batch GD)."""
        return self.train_batch_size or self.rollout_buffer_size

    @property
    def uses_critics(self) -> bool:
        """Whether the run trains critics (critic LMs or value heads): the actor-critic trainers, and MARLHF(-iter)
        with a maac/iac backend."""
        return False

    def model_sources(self) -> list[tuple[str, str]]:
        """The models this section names besides the agents (a reward model, comparators), as (config field,
        source); none here."""
        return []


class _CriticFields(_Strict):
    """The critic fields of `IACConfig` and `MAACConfig` (MARLHF passes them to a maac/iac backend)."""

    critic_learning_rate: float | None = Field(5e-6, gt=0, description="AdamW learning rate of the critic(s); "
                                                                         "null = agent_learning_rate.")
    critic_devices: str | list[str] | None = Field(None, description="Device(s) of the critic(s) for mp.")
    critic_type: Literal["v", "q"] = Field("v", description="v: V(h) at the last prompt token; q: Q(h,a) at the "
                                                            "last response token (case-insensitive).")
    value_loss_coef: float = Field(0.6, ge=0, description="Weight of the value loss.")
    critic_value_head_hidden_dim: int | None = Field(
        None, ge=1, description="Hidden dim of the critic's head (IAC: each separate critic's; MAAC: the central "
                                "critic's, the reference's model_config key); null = the critic's hidden size.")

    @field_validator("critic_type", mode="before")
    @classmethod
    def _critic_type(cls, v):
        return v.lower() if isinstance(v, str) else v


class _IACFields(_Strict):
    """The fields only `IACConfig` has (MARLHF passes them to an iac backend)."""

    use_separate_critic: bool = Field(True, description="A separate critic LM + head per agent (else a value head "
                                                        "on each actor, one optimizer, one joint loss).")
    value_clip_range: float | None = Field(0.2, ge=0, description="PPO-style value clipping (shared-head mode only).")
    value_head_hidden_dim: int | None = Field(None, ge=1, description="Hidden dim of the actor's value head "
                                                                      "(shared mode); null = the LM hidden size.")


# --- trainer (the reference's MAGRPOConfig) -------------------------------------------------------


class MAGRPOConfig(_TrainerBase):
    """CoMLRL 1.4.3 `MAGRPOConfig` fields with its defaults and checks (e.g. num_generations >= 2)."""

    num_generations: int = _override(_TrainerBase, "num_generations", 4, ge=2)
    joint_mode: str = Field("aligned", description="aligned (K joint actions) | cross (K^N, Cartesian product); "
                                                   "aliases align, crossed.")
    advantage_mode: str | None = Field(None, description="mean | raw | max | rloo; null = the algorithm's default.")
    advantage_normalization_scope: Literal["group", "agent", "batch"] = Field(
        "group", description="What advantage_normalization z-normalizes over: group (one node x agent, CoMLRL's) | "
                             "agent (all of an agent's advantages in the update: Dr. MAS, arXiv 2602.08847) | batch "
                             "(all agents' in the update: REINFORCE++-baseline, arXiv 2501.03262); coopflow extension.")
    loss_on_padding: bool = Field(
        True, description="The reference's exact loss: each completion padded to its node's longest with pad tokens, "
                          "pads scored, each padded row's last token not (CoMLRL 1.4.3); false: every completion "
                          "token up to EOS is scored and pads never are.")
    loss_chunk_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="Cap a loss forward at this many padded tokens (rows × (longest prompt + longest "
                            "completion); each distinct prompt counted once where the model runs it once for its "
                            "completions): the minibatch runs as length-sorted chunks whose gradients add up before "
                            "its one AdamW step, so peak activation memory follows the chunk; null = the whole "
                            "minibatch in one forward; auto = 1024 where the loss runs in float32, null under a "
                            "bf16/fp16 compute dtype.")
    tree_expansion: Literal["all", "best"] = Field(
        "all", description="Multi-turn trees: all (every joint action continues: CoMLRL's K^H tree) | best (only a "
                           "node's highest-reward joint action continues: AT-GRPO's greedy tree sampling, one node of "
                           "K candidates per agent per turn, each judged by its turn's reward; arXiv 2510.11062); "
                           "coopflow extension.")
    team_reward_weight: float = Field(
        1.0, ge=0, description="alpha of AT-GRPO's reward mix: agent i's reward = alpha * team + local_i when the "
                               "reward function returns [team, local_1, ..., local_N] per joint action (a one-value "
                               "reward gives alpha * team); coopflow extension.")
    num_policy_epochs: int = Field(
        1, ge=1, description="Optimizer passes over each rollout buffer (1 = CoMLRL's single REINFORCE step); more "
                             "reuse the samples through the ratio to the policy that sampled them (PPO-style; "
                             "coopflow extension).")
    clip_range: float | None = Field(
        None, gt=0, lt=1, description="Clip that ratio to [1 - clip_range, 1 + clip_range] (PPO/GRPO's 0.2; GSPO uses "
                                      "~3e-4 at ratio_level sequence); null = no ratio and no clipping when "
                                      "num_policy_epochs is 1 (the reference's loss), an unclipped ratio otherwise.")
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="token: one ratio per token (PPO/GRPO as in TRL and verl) | sequence: GSPO's length-"
                             "normalized sequence ratio (Zheng et al. 2025, arXiv 2507.18071).")
    collaboration_mode: str = Field(
        "decentralized", description="decentralized: one policy per agent | centralized: one joint actor writes "
                                     "every role's output in one completion, split by the run's centralized_adapter "
                                     "(single turn; aliases centralised, single_agent, decentralised, multi_agent).")

    @field_validator("joint_mode")
    @classmethod
    def _joint(cls, v: str) -> str:
        return _alias(v, JOINT_MODE_ALIASES, "joint_mode", "one of aligned, align, cross, crossed")

    @field_validator("collaboration_mode")
    @classmethod
    def _collab(cls, v: str) -> str:
        return _alias(v, COLLABORATION_ALIASES, "collaboration_mode", "decentralized or centralized (or an alias)")

    @field_validator("advantage_mode")
    @classmethod
    def _adv(cls, v: str | None) -> str | None:
        if v is not None and v not in ("mean", "raw", "max", "rloo"):
            raise ValueError(f"advantage_mode must be one of mean, raw, max, rloo; got {v!r}")
        return v

    @model_validator(mode="after")
    def _post(self) -> "MAGRPOConfig":
        if self.parallel_training == "mp" and not self.agent_devices:
            raise ValueError("parallel_training='mp' requires agent_devices")
        return self


class CentralizedMAGRPOConfig(MAGRPOConfig):
    """CoMLRL 1.4.3 `CentralizedMAGRPOConfig`: MAGRPOConfig for one joint actor (collaboration_mode centralized,
    single turn; `max_new_tokens` is the whole joint completion's budget)."""

    num_turns: int = _override(MAGRPOConfig, "num_turns", 1, "Must be 1: centralized MAGRPO is single-turn.")
    collaboration_mode: str = _override(MAGRPOConfig, "collaboration_mode", "centralized",
                                        "Must be centralized (one joint actor writes every role).")

    @model_validator(mode="after")
    def _post_central(self) -> "CentralizedMAGRPOConfig":
        if self.collaboration_mode != "centralized":
            raise ValueError(f"CentralizedMAGRPOConfig is for centralized collaboration: collaboration_mode must be "
                             f"'centralized', got {self.collaboration_mode!r}")
        if self.num_turns != 1:
            raise ValueError(f"CentralizedMAGRPOConfig is single-turn: it needs num_turns=1, got {self.num_turns}")
        return self


class MAREINFORCEConfig(MAGRPOConfig):
    """CoMLRL's `MAREINFORCEConfig`: MAGRPOConfig with advantage_mode 'raw' (no baseline)."""

    advantage_mode: str | None = _override(MAGRPOConfig, "advantage_mode", "raw", "mean | raw | max | rloo "
                                                                                  "(MAREINFORCE: raw).")


class MARLOOConfig(MAGRPOConfig):
    """CoMLRL's `MARLOOConfig`: MAGRPOConfig with advantage_mode 'rloo' (leave-one-out baseline)."""

    advantage_mode: str | None = _override(MAGRPOConfig, "advantage_mode", "rloo", "mean | raw | max | rloo "
                                                                                   "(MARLOO: rloo).")


class MAReMaxConfig(MAGRPOConfig):
    """CoMLRL's `MAReMaxConfig`: MAGRPOConfig with advantage_mode 'max' (group-max baseline)."""

    advantage_mode: str | None = _override(MAGRPOConfig, "advantage_mode", "max", "mean | raw | max | rloo "
                                                                                  "(MAReMax: max).")


# --- trainer (the reference's IACConfig / MAACConfig) --------------------------------------------


class ActorCriticConfig(_CriticFields, _TrainerBase):
    """Fields shared by CoMLRL 1.4.3's `IACConfig` and `MAACConfig`, with the same defaults."""

    num_train_epochs: int = _override(_TrainerBase, "num_train_epochs", 40)
    logging_steps: int = _override(_TrainerBase, "logging_steps", 1)
    num_generations: int = _override(_TrainerBase, "num_generations", 1)
    top_k: int | None = _override(_TrainerBase, "top_k", None)
    rollout_buffer_size: int = _override(_TrainerBase, "rollout_buffer_size", 8)

    @model_validator(mode="after")
    def _post_ac(self) -> "ActorCriticConfig":
        if self.num_turns > 1 and self.num_generations != 1:
            raise ValueError(f"multi-turn actor-critic (num_turns={self.num_turns}) requires num_generations == 1, "
                             f"got {self.num_generations}")
        if self.parallel_training == "mp" and not self.agent_devices:
            raise ValueError("parallel_training='mp' requires agent_devices")
        return self

    @model_validator(mode="after")
    def _critic_lr(self) -> "ActorCriticConfig":
        if self.critic_learning_rate is None:  # the reference fills it in from the agents' rate
            self.critic_learning_rate = self.agent_learning_rate
        return self

    @property
    def critic_lr(self) -> float:
        """Resolved critic learning rate."""
        return self.critic_learning_rate or self.agent_learning_rate

    @property
    def uses_critics(self) -> bool:
        """Always: IAC's per-agent critics (or value heads), MAAC's central critic."""
        return True

    @property
    def joint_mode(self) -> Literal["aligned"]:
        """Always aligned: each node's K samples per agent form K joint actions (no cross product)."""
        return "aligned"

    @property
    def tree_expansion(self) -> Literal["all"]:
        """Always all: actor-critic episodes are single paths (K = 1); greedy trees are MAGRPO-family only."""
        return "all"

    @property
    def collaboration_mode(self) -> Literal["decentralized"]:
        """Always decentralized: one actor per agent (a centralized joint actor is MAGRPO-family only)."""
        return "decentralized"


class IACConfig(_IACFields, ActorCriticConfig):
    """CoMLRL 1.4.3 `IACConfig`: independent actor-critic, one critic per agent (others count as environment)."""

    @model_validator(mode="after")
    def _post_iac(self) -> "IACConfig":
        if self.parallel_training == "mp" and self.use_separate_critic and not self.critic_devices:
            raise ValueError("parallel_training='mp' with use_separate_critic requires critic_devices")
        return self


class MAACConfig(ActorCriticConfig):
    """CoMLRL 1.4.3 `MAACConfig`: one centralized critic over the joint history, shared by every agent's update."""

    @model_validator(mode="after")
    def _post_maac(self) -> "MAACConfig":
        if self.parallel_training == "mp" and not self.critic_devices:
            raise ValueError("parallel_training='mp' in MAAC requires both agent_devices and critic_devices")
        return self
