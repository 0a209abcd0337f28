"""The `trainer` section of the preference trainers: CoMLRL 1.4.3's MADPOConfig, MARLHFConfig and the iterative
MADPOIterConfig / MARLHFIterConfig, field for field, with the replay rules they check."""

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from coopflow.schemas.config.common import GENERATION_ALIASES, _alias, _override, _Strict
from coopflow.schemas.config.trainer import MAGRPOConfig, _CriticFields, _IACFields, _TrainerBase

PAIR_SELECTIONS = ("reward_gap", "random", "all")
RL_ALIASES = {"magrpo": "magrpo", "mareinforce": "mareinforce", "mareforce": "mareinforce", "maremax": "maremax",
              "marloo": "marloo", "maac": "maac", "iac": "iac"}


class MADPOConfig(MAGRPOConfig):
    """CoMLRL 1.4.3 `MADPOConfig`: MAGRPOConfig's fields with single-turn defaults plus preferences."""

    num_train_epochs: int = _override(MAGRPOConfig, "num_train_epochs", 20, "Passes over the preference pairs (DPO) "
                                                                             "/ RL epochs (MARLHF).")
    num_turns: int = _override(MAGRPOConfig, "num_turns", 1, "Must be 1: the preference trainers are single-turn.",
                               le=1)
    early_termination_threshold: float | None = _override(MAGRPOConfig, "early_termination_threshold", None,
                                                          "Unused (single turn).")
    preference_num_candidates: int = Field(80, ge=2, description="P joint candidates sampled per item (aligned).")
    preference_pairs_per_sample: int | None = Field(16, ge=1, description="Pairs kept per item (null = all; must be "
                                                                          "null with pair_selection 'all').")
    pair_selection: Literal["reward_gap", "random", "all"] = Field(
        "reward_gap", description="reward_gap: largest reward gaps first | random: seeded shuffle | all: every pair.")
    dpo_beta: float = Field(0.1, gt=0, description="DPO inverse temperature beta.")
    use_environment_step: bool = Field(True, description="Advance env_step by environment_steps_per_pair per pair.")
    environment_steps_per_pair: int = Field(2, ge=1, description="env_steps one preference pair counts for.")

    @model_validator(mode="after")
    def _post_pref(self) -> "MADPOConfig":
        if self.joint_mode != "aligned":
            raise ValueError("preference learning supports joint_mode 'aligned' only")
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError("pair_selection 'all' requires preference_pairs_per_sample: null")
        return self

    @property
    def num_rounds(self) -> int:
        """Training rounds, each with its own candidates and checkpoint: 1 (offline), num_iterations (iterative)."""
        return 1


class MARLHFConfig(_IACFields, _CriticFields, MADPOConfig):
    """CoMLRL 1.4.3 `MARLHFConfig`: a joint reward model fit on the pairs, then online RL on it (the
    critic fields go to a maac/iac backend, see `rl_trainer_fields`)."""

    rl_algorithm: str = Field("magrpo", description="RL backend on the frozen reward model: magrpo | mareinforce | "
                                                    "maremax | marloo | maac | iac (alias mareforce).")
    num_generations: int = _override(_TrainerBase, "num_generations", 4, "K samples per agent in the RL phase (>= 2 "
                                                                         "for the MAGRPO family, >= 1 for maac/iac).")
    reward_model_name: str | None = Field(None, description="Reward-model backbone ('tiny', dir or HF id); null = "
                                                            "the agents' model.")
    reward_model_device: str | None = Field(None, description="Device of the reward model; null = agents.device "
                                                              "(the reference defaults to cuda:0).")
    reward_learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate of the reward model.")
    reward_num_train_epochs: int = Field(1, ge=1, description="Passes over the pairs when fitting the reward model.")
    reward_train_batch_size: int = Field(1, ge=1, description="Pairs per reward-model step.")
    reward_max_length: int | None = Field(None, ge=1, description="Truncate reward-model inputs to this many tokens.")
    reward_freeze_backbone: bool = Field(False, description="Train only the linear head of the reward model.")
    critic_model_name: str | None = Field(None, description="Critic source for maac/iac; null = the agents' model.")
    critic_learning_rate: float | None = _override(_CriticFields, "critic_learning_rate", None)

    @field_validator("rl_algorithm")
    @classmethod
    def _rl(cls, v: str) -> str:
        key = str(v).lower()
        if key not in RL_ALIASES:
            raise ValueError(f"rl_algorithm must be one of magrpo, mareinforce, maremax, marloo, maac, iac; got {v!r}")
        return RL_ALIASES[key]

    @model_validator(mode="after")
    def _post_rlhf(self) -> "MARLHFConfig":
        if self.rl_algorithm not in ("maac", "iac") and self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 for rl_algorithm {self.rl_algorithm!r}")
        if self.collaboration_mode == "centralized" and self.rl_algorithm in ("maac", "iac"):
            raise ValueError(f"collaboration_mode centralized trains its joint actor with the MAGRPO family here: "
                             f"rl_algorithm {self.rl_algorithm!r} is not supported with it (use magrpo, mareinforce, "
                             "marloo or maremax)")
        return self

    @property
    def uses_critics(self) -> bool:
        """Whether the RL backend trains critics: rl_algorithm maac or iac."""
        return self.rl_algorithm in ("maac", "iac")

    def model_sources(self) -> list[tuple[str, str]]:
        """The reward model's backbone, when given (null: the agents' model)."""
        return [("trainer.reward_model_name", self.reward_model_name)] if self.reward_model_name else []


REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


def check_replay(mode: str, k: int | None, lam: float | None, sample_size: int | None) -> None:
    """The reference's replay-argument rules; ValueError names the field."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"preference_replay_mode must be one of {', '.join(REPLAY_MODES)}; got {mode!r}")
    if sample_size is not None and sample_size < 1:
        raise ValueError("preference_replay_sample_size must be >= 1 or null")
    if mode == "current":
        if k not in (None, 1) or lam is not None or sample_size is not None:
            raise ValueError("preference_replay_mode 'current' takes no preference_replay_lambda or "
                             "preference_replay_sample_size, and preference_replay_k only as null or 1")
    elif mode == "nearest_k":
        if k is None or k < 1:
            raise ValueError("preference_replay_mode 'nearest_k' requires preference_replay_k >= 1")
        if lam is not None:
            raise ValueError("preference_replay_mode 'nearest_k' does not take preference_replay_lambda")
    elif mode == "all_history":
        if k is not None or lam is not None:
            raise ValueError("preference_replay_mode 'all_history' takes neither preference_replay_k nor "
                             "preference_replay_lambda")
    elif mode == "lambda_decay":
        if lam is None or not 0.0 <= lam <= 1.0:
            raise ValueError("preference_replay_mode 'lambda_decay' requires preference_replay_lambda in [0, 1]")
        if k is not None:
            raise ValueError("preference_replay_mode 'lambda_decay' does not take preference_replay_k")


COMPARATOR_ALIASES = {"current": "current", "self": "current", "online": "current",
                      "history": "history", "checkpoint": "history", "previous": "history",
                      "previous_iteration": "history",
                      "model": "model", "external": "model", "comparator": "model", "reference": "model", "ref": "model",
                      "api": "api", "http": "api", "endpoint": "api",
                      "current_copy": "current_copy", "copy": "current_copy", "online_copy": "current_copy",
                      "current_offload": "current_copy", "current-offload": "current_copy"}


class _IterativeFields(_Strict):
    """The fields of the iterative (online) preference trainers: rounds, replay and the comparator, with their
    per-round defaults of MADPOConfig's pair fields. MADPOIterConfig puts them in front of MADPOConfig and
    MARLHFIterConfig in front of MARLHFConfig, so each has one trainer base (its checks read that base's
    collaboration_mode and num_agents)."""

    num_iterations: int = Field(6, ge=1, description="Rounds (iterations); a scheduled run adds rounds up to this.")
    preference_num_candidates: int = _override(MADPOConfig, "preference_num_candidates", 20, "P target candidates "
                                               "per item per round.", ge=1)
    preference_pairs_per_sample: int | None = _override(MADPOConfig, "preference_pairs_per_sample", 4,
                                                        "Pairs kept per item per round.")
    pair_selection: Literal["comparator_reward", "reward_gap", "random", "all"] = _override(
        MADPOConfig, "pair_selection", "comparator_reward", "comparator_reward (comparator reward, then gap) | "
                                                            "reward_gap | random | all.")
    preference_replay_mode: str = Field("current", description="current | nearest_k | all_history | lambda_decay.")
    preference_replay_k: int | None = Field(None, description="Shards nearest_k samples from.")
    preference_replay_lambda: float | None = Field(None, description="lambda_decay's λ in [0, 1].")
    preference_replay_sample_size: int | None = Field(None, description="Training pairs per round (null: this "
                                                                         "round's count).")
    log_reward_distribution: bool = Field(False, description="Log the per-round reward histograms (needs a reward "
                                                             "range: reward.reward_range or the function's).")
    comparator_policy: str = Field("current", description="current (independent RNG stream) | current_copy (a "
                                                          "frozen copy, on comparator_devices) | history (the "
                                                          "checkpoint k rounds back) | model (frozen models) | api.")
    preference_replay_dir: str | None = Field(
        None, description="Also export each round's pairs here as iteration_XXXX.json ({iteration, num_pairs, pairs}, "
                          "written atomically); replay itself reads the artifact store.")
    policy_checkpoint_dir: str | None = Field(
        None, description="Also export the initial policy (initial/agent_i) and each round's (iteration_XXXX/agent_i) "
                          "here as HF dirs; the history comparator reads the artifact store.")
    comparator_generation_mode: str = Field(
        "decentralized", description="decentralized: one comparator model per agent | centralized: a coordinator "
                                     "(comparator agent comparator_centralized_agent_index) writes every role in one "
                                     "completion through the centralized_adapter | centralized_sequential: roles "
                                     "written in order, each seeing the earlier roles (N >= 2; beyond CoMLRL 1.4.3). "
                                     "Forced to centralized under collaboration_mode centralized.")
    comparator_centralized_agent_index: int = Field(0, ge=0, description="Which comparator agent coordinates in "
                                                                         "centralized generation (< num_agents).")
    comparator_model_name: str | None = Field(None, description="model comparator: one source for all agents.")
    comparator_agents: list[str] | None = Field(None, description="model comparator: one source per agent.")
    comparator_num_candidates: int | None = Field(None, ge=1, description="P_c comparator candidates (null = P).")
    comparator_devices: str | list[str] | None = Field(None, description="Devices of current_copy / model "
                                                                         "comparators; null = the agents' device.")
    comparator_history_k: int | None = Field(None, ge=1, description="history comparator: rounds back (default 1).")
    comparator_api_url: str | None = Field(None, description="api comparator: the HTTP endpoint (required for api).")
    comparator_api_model: str | None = Field(None, description="api comparator: model name sent in the request.")
    comparator_api_format: str = Field("generic", description="generic | openai (openai_chat, chat) | anthropic "
                                                              "(anthropic_messages, messages) | openai_responses.")
    comparator_api_timeout: float = Field(120.0, gt=0, description="api comparator: seconds per request.")
    comparator_api_retries: int = Field(2, ge=0, description="api comparator: retries after a timeout or HTTP 5xx.")
    comparator_api_max_n_per_request: int | None = Field(None, ge=1, description="openai format: n per request cap.")
    comparator_api_headers: dict[str, str] | None = Field(None, description="api comparator: extra HTTP headers; a "
                                                                            "value 'env:VAR' is read from the "
                                                                            "environment (values are never logged).")
    comparator_api_key: str | None = Field(None, description="api comparator: the key itself (prefer "
                                                             "comparator_api_key_env; never logged).")
    comparator_api_key_env: str | None = Field(None, description="api comparator: environment variable holding "
                                                                 "the key.")
    comparator_api_key_header: str = Field("Authorization", description="api comparator: header carrying the key.")
    comparator_api_key_prefix: str = Field("Bearer", description="api comparator: prefix before the key.")
    comparator_api_extra_body: dict[str, Any] | None = Field(None, description="api comparator: extra request fields.")
    comparator_api_response_field: str = Field("completions", description="generic format: dotted path of the "
                                                                           "completions list in the response.")

    @field_validator("comparator_policy")
    @classmethod
    def _comparator(cls, v: str) -> str:
        return _alias(v, COMPARATOR_ALIASES, "comparator_policy",
                      "one of current, current_copy, history, model, api (or an alias)")

    @field_validator("comparator_generation_mode")
    @classmethod
    def _generation(cls, v: str) -> str:
        return _alias(v, GENERATION_ALIASES, "comparator_generation_mode",
                      "decentralized, centralized or centralized_sequential (or an alias)")

    @model_validator(mode="after")
    def _post_iter(self) -> "_IterativeFields":
        if self.collaboration_mode == "centralized":
            if self.comparator_centralized_agent_index != 0:
                raise ValueError("collaboration_mode centralized has one actor: comparator_centralized_agent_index "
                                 "must be 0 (the coordinator is actor index 0)")
            if self.comparator_generation_mode == "centralized_sequential":
                raise ValueError("collaboration_mode centralized compares joint completions: "
                                 "comparator_generation_mode centralized_sequential is for decentralized agents")
            self.comparator_generation_mode = "centralized"
        elif "num_agents" in self.model_fields_set and self.num_agents is not None \
                and self.comparator_centralized_agent_index >= self.num_agents:
            raise ValueError(f"comparator_centralized_agent_index {self.comparator_centralized_agent_index} must be "
                             f"below num_agents {self.num_agents}")
        if self.comparator_generation_mode == "centralized_sequential" and (self.num_agents or 2) < 2:
            raise ValueError("comparator_generation_mode centralized_sequential needs num_agents >= 2")
        check_replay(self.preference_replay_mode, self.preference_replay_k, self.preference_replay_lambda,
                     self.preference_replay_sample_size)
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        if self.comparator_policy == "model" and not has_model:
            raise ValueError("comparator_policy 'model' requires comparator_model_name or comparator_agents")
        if self.comparator_policy != "model" and has_model:
            raise ValueError("comparator_model_name / comparator_agents are only allowed with comparator_policy 'model'")
        if self.comparator_history_k is not None and self.comparator_policy != "history":
            raise ValueError("comparator_history_k is only allowed with comparator_policy 'history'")
        if self.comparator_policy == "api" and not self.comparator_api_url:
            raise ValueError("comparator_policy 'api' requires comparator_api_url")
        return self

    @property
    def num_rounds(self) -> int:
        """Training rounds: num_iterations."""
        return self.num_iterations

    def comparator_sources(self) -> list[tuple[str, str]]:
        """The model comparator's sources, when given, as (config field, source)."""
        out = [("trainer.comparator_model_name", self.comparator_model_name)] if self.comparator_model_name else []
        return out + [("trainer.comparator_agents", s) for s in self.comparator_agents or []]


class MADPOIterConfig(_IterativeFields, MADPOConfig):
    """CoMLRL 1.4.3 `MADPOIterConfig`: rounds of target-vs-comparator pairs, replay, DPO."""

    num_train_epochs: int = _override(MADPOConfig, "num_train_epochs", 1, "DPO passes over each round's training "
                                                                          "pairs.")

    @property
    def preference_scoring_reward(self) -> Literal["task"]:
        """What scores a round's candidates: always the task reward (MADPO-iter fits no reward model)."""
        return "task"

    def model_sources(self) -> list[tuple[str, str]]:
        """The model comparator's sources, when given."""
        return super().model_sources() + self.comparator_sources()


class MARLHFIterConfig(_IterativeFields, MARLHFConfig):
    """CoMLRL 1.4.3 `MARLHFIterConfig`: per round a fresh joint reward model on the round's training
    pairs, then the RL backend on it."""

    num_train_epochs: int = _override(MARLHFConfig, "num_train_epochs", 2, "RL epochs per round (over the "
                                                                           "training items).")
    reward_num_train_epochs: int = _override(MARLHFConfig, "reward_num_train_epochs", 2, "Passes over the round's "
                                             "training pairs when fitting its fresh reward model.")
    preference_scoring_reward: Literal["task", "reward_model"] = Field(
        "task", description="What scores a round's candidates for its pairs: task | reward_model (the previous "
                            "round's reward model; round 1 falls back to the task reward).")

    def model_sources(self) -> list[tuple[str, str]]:
        """The reward model's backbone, then the model comparator's sources (when given)."""
        return super().model_sources() + self.comparator_sources()
