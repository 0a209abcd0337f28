"""A whole run config: `RunConfig` (the MAGRPO family) and one subclass per other algorithm, which narrows
`algorithm` and `trainer` (and adds a `critic` section for IAC / MAAC), plus the pipeline sections (`critic`,
`ray`, `tracking`) and `RUN_CONFIGS`, the run config class of each algorithm."""

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from coopflow.schemas.config.agents import AgentsConfig
from coopflow.schemas.config.common import ALGORITHM_ADVANTAGE, _Strict, data_dir_path, per_agent_values, store_path
from coopflow.schemas.config.preference import RL_ALIASES, MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
from coopflow.schemas.config.tasks import FormatterConfig, RewardConfig, TasksetConfig, TransitionConfig
from coopflow.schemas.config.trainer import IACConfig, MAACConfig, MAGRPOConfig

class CriticConfig(_Strict):
    """Critic model sources: IAC separate critics take one per agent (or one, broadcast), MAAC exactly one."""

    critic_model: str | None = Field(None, description="One critic source ('tiny', a local dir or an HF id); IAC "
                                                       "broadcasts it to every agent.")
    critics: list[str] | None = Field(None, description="Critic sources: one per agent (IAC) or exactly one (MAAC).")
    refit_epochs: int = Field(1, ge=1, description="Passes over a run's stored ac_samples when the 'critic' stage "
                                                   "re-fits its trained critic(s).")
    refit_learning_rate: float | None = Field(None, gt=0, description="Learning rate of the re-fit; null = "
                                                                       "trainer.critic_learning_rate.")

    def model_sources(self) -> list[tuple[str, str]]:
        """The critic sources given, as (config field, source)."""
        out = [("critic.critics", s) for s in self.critics or []]
        return out + ([("critic.critic_model", self.critic_model)] if self.critic_model else [])


# --- pipeline ------------------------------------------------------------------------------------


class RayConfig(_Strict):
    """Ray, for agents as Ray actors (`trainer.parallel_training: ray`) and reward fan-out (`reward.executor: ray`).

    Needs `pip install 'coopflow[ray]'`. Unused unless one of those asks for Ray."""

    address: str | None = Field(None, description="Cluster to join: null = $RAY_ADDRESS when set, else start a local "
                                                  "Ray instance for the run; 'auto' = the cluster this node belongs "
                                                  "to; 'ray://head:10001' = a remote cluster through Ray Client.")
    num_cpus_per_agent: float | list[float] = Field(
        1.0, description="CPUs each agent's actor reserves (one value, or one per agent); its torch threads = "
                         "max(1, int(value)).")
    num_gpus_per_agent: float | list[float] = Field(
        0.0, description="GPUs each agent's actor reserves (one value, or one per agent); > 0 puts that agent on "
                         "'cuda' unless agent_devices says otherwise.")
    local_num_cpus: int | None = Field(None, ge=1, description="CPUs a locally started instance offers (null = all "
                                                               "of this machine).")
    object_store_mb: int | None = Field(None, ge=64, description="Object store of a locally started instance, MiB "
                                                                 "(null = Ray's default, 30 % of memory).")

    @field_validator("num_cpus_per_agent", "num_gpus_per_agent")
    @classmethod
    def _nonneg(cls, v):
        for x in v if isinstance(v, list) else [v]:
            if x < 0:
                raise ValueError(f"must be >= 0, got {x}")
        return v

    def per_agent(self, field: str, n: int) -> list[float]:
        """`field` (num_cpus_per_agent | num_gpus_per_agent) for each of n agents."""
        return [float(x) for x in per_agent_values(getattr(self, field), n, f"ray.{field}")]


class TrackingConfig(_Strict):
    """MLflow tracking."""

    enabled: bool = Field(True, description="Log params, metrics, plots and lineage to MLflow.")
    experiment: str = Field("coopflow", description="MLflow experiment name.")
    run_name: str | None = Field(None, description="MLflow run name; null = '<algorithm>-<config key>'.")
    tracking_uri: str | None = Field(None, description="MLflow URI; null = sqlite:///<data_dir>/mlflow.db.")
    rollouts: Literal["all", "eval", "none"] | int = Field(
        10, description="Joint answers logged to MLflow as tables (the run's Artifacts, rollouts/): all | N (every "
                        "Nth update and the last) | eval (the evaluations' only) | none. The store keeps all of them "
                        "whatever this says (coopflow show / export).")

    @field_validator("rollouts")
    @classmethod
    def _every_n(cls, v):
        if isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise ValueError("tracking.rollouts: give all, eval, none or a number of updates >= 1 (every Nth update)")
        return v


class SandboxConfig(_Strict):
    """How model-written programs (the coding environments' rewards) are fenced."""

    require_isolation: bool = Field(False, description="Refuse to run (pre-flight) on a machine that allows no "
                                                       "OS-level isolation of model-written programs (neither root's "
                                                       "own-uid fences nor unprivileged namespaces + Landlock), "
                                                       "instead of running them behind the Python-level guard only.")


class RunConfig(_Strict):
    """A full coopflow run of the MAGRPO family."""

    algorithm: Literal["magrpo", "mareinforce", "marloo", "maremax"] = Field(
        "magrpo", description="Which MAGRPO-family algorithm (sets the default advantage_mode).")
    env: str | None = Field(
        None, description="An environment filling taskset, reward, formatters, transition and eval hooks: a shipped "
                          "name (humaneval, gsm8k, ...), or an import path (pkg.module:Name); the config's own "
                          "sections win. null = the sections as written.")
    agents: AgentsConfig = Field(default_factory=lambda: AgentsConfig(agent_model="tiny"),
                                 description="The agents.")
    taskset: TasksetConfig = Field(default_factory=TasksetConfig, description="The task items.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The shared reward.")
    formatters: list[FormatterConfig] | FormatterConfig | None = Field(
        None, description="One formatter for all agents, or a list with one per agent; null = item['prompt'].")
    trainer: MAGRPOConfig = Field(default_factory=MAGRPOConfig, description="Reference MAGRPOConfig fields.")
    transition: TransitionConfig | None = Field(
        None, description="Multi-turn transition (required when trainer.num_turns > 1); null for single-turn runs.")
    seed: int = Field(0, description="Seed of generation sampling, minibatch shuffles and the tiny model.")
    data_dir: str | None = Field(None, description="Data directory (a path or a file:// URI); null = $COOPFLOW_HOME "
                                                   "or ./.coopflow.")
    remote_store: str | None = Field(
        None, description="Object storage that mirrors the artifact store (an fsspec URL: s3://bucket/prefix, "
                          "gs://..., az://...): commits are published there, missing artifacts fetched and verified; "
                          "the data dir stays the local cache. null = $COOPFLOW_REMOTE_STORE, else none.")
    remote_store_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec storage options of remote_store (e.g. {endpoint_url: ...}); keep "
                                          "credentials in the environment (AWS_ACCESS_KEY_ID, ...), not here.")
    checkpoint_every: int = Field(0, ge=0, description="Write a checkpoint every this many updates (0 = once per epoch).")
    checkpoint_optimizer: Literal["all", "last", "none"] = Field(
        "last", description="Which checkpoints keep optimizer (AdamW) state, about 2/3 of a full-model checkpoint: "
                            "all | last (a segment's checkpoint drops it once the next one is written, so only a "
                            "run's final checkpoint keeps it) | none (the final one drops it too; continuing the run "
                            "replays its stored updates). Resuming is exact either way; weights-only checkpoints "
                            "are stored under '<key>-weights'.")
    checkpoint_write: Literal["auto", "background", "inline"] = Field(
        "auto", description="How each segment's checkpoint is written: background = while the next segment (or the "
                            "final evaluation) starts, each agent's files written and hashed on a thread where the "
                            "agent lives and the next update waiting for them; inline = before the run goes on; "
                            "auto = background where the agents run on a GPU, inline on CPUs (where the write takes "
                            "the cores the next phase needs). The same files either way.")
    eval_before: bool = Field(True, description="Evaluate the initial policies before training on the same eval "
                                                "items and eval seed as the final evaluation (summary eval_before, "
                                                "MLflow eval_before/*; the reference evaluates at batch 0).")
    cache_salt: str | None = Field(None, description="Any string: keys this run's stages apart from every stored run, "
                                                     "so nothing stored is reused (`coopflow run --fresh` sets a new "
                                                     "one, e.g. to time a run); built models are still reused. null "
                                                     "= normal caching.")
    max_sequences: int = Field(2_000_000, ge=0, description="Refuse a run that would generate more sequences than "
                                                            "this (pre-flight budget; 0 = no limit).")
    check_disk: bool = Field(True, description="Refuse a run whose estimated writes (checkpoints, rollouts) exceed "
                                               "the free disk under the data dir (pre-flight; the estimate is "
                                               "printed either way); false = print only.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="How model-written programs are "
                                                                              "fenced (coding environments).")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster and per-agent resources (used by "
                                                                  "parallel_training: ray and reward.executor: ray).")
    eval_logger: str | None = Field(
        None, description="Import path of eval_logger(agent_completions_turns, test_cases, entry_points, prompts) "
                          "-> detailed results (the reference's evaluation hook; needs eval_aggregator).")
    eval_aggregator: str | None = Field(
        None, description="Import path of eval_aggregator(detailed, num_turns) -> {'turn_k/...': float}, logged as "
                          "eval/turn_k/... (needs eval_logger).")
    metrics_callback: str | None = Field(
        None, description="'module:function' called after every update with that update's samples (dicts: item_id, "
                          "turn, agent, sample, prompt, completion_text, reward) -> {name: float}, logged unprefixed.")
    centralized_adapter: str | None = Field(
        None, description="trainer.collaboration_mode centralized (and centralized comparators): import path of the "
                          "adapter, a class (built with centralized_adapter_kwargs) or an object with "
                          "build_prompt(item, agent_prompts) and parse_completion(completion, item, num_agents); "
                          "null = the tagged adapter (<agent_i>...</agent_i> sections).")
    centralized_adapter_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments the centralized_adapter class is built with.")

    @model_validator(mode="after")
    def _post(self) -> "RunConfig":
        t = self.trainer
        if (self.eval_logger is None) != (self.eval_aggregator is None):
            raise ValueError("eval_logger and eval_aggregator go together: set both or neither")
        explicit = "num_agents" in t.model_fields_set and t.num_agents is not None
        if explicit and self.agents.num_agents is not None and t.num_agents != self.agents.num_agents:
            raise ValueError(f"trainer.num_agents={t.num_agents} disagrees with agents.num_agents={self.agents.num_agents}")
        if explicit and self.agents.num_agents is None:
            self.agents = AgentsConfig.model_validate({**self.agents.model_dump(), "num_agents": t.num_agents})
        if t.num_agents != self.agents.n:  # keep the alias equal to the resolved count (a dumped config validates)
            self.trainer = t = t.model_copy(update={"num_agents": self.agents.n})
        rdev = t.reference_devices
        if isinstance(rdev, list) and len(rdev) not in (1, self.agents.n):
            raise ValueError(f"trainer.reference_devices length ({len(rdev)}) must be 1 or {self.agents.n}.")
        if self.centralized:
            if t.num_turns != 1:
                raise ValueError(f"trainer.collaboration_mode centralized is single-turn: trainer.num_turns must be 1, "
                                 f"got {t.num_turns}")
            if self.agents.agents and len(set(self.agents.agents)) > 1:
                raise ValueError("trainer.collaboration_mode centralized trains exactly one actor: give it as "
                                 "agents.agent_model (agents.num_agents counts the roles it writes)")
        if t.num_turns > 1 and self.transition is None:
            raise ValueError(f"trainer.num_turns={t.num_turns} (multi-turn) needs a transition: set transition.name "
                             "to plain, feedback or 'module:function' (or trainer.num_turns: 1 for single-turn)")
        if isinstance(self.formatters, list) and len(self.formatters) != self.agents.n:
            raise ValueError(f"formatters has {len(self.formatters)} entries but there are {self.agents.n} agents")
        return self

    @property
    def centralized(self) -> bool:
        """One joint actor writes all N role outputs (trainer.collaboration_mode centralized)."""
        return self.trainer.collaboration_mode == "centralized"

    def actor_sources(self) -> list[str]:
        """One model source per trained policy: N agents, or the one joint actor of centralized collaboration."""
        src = self.agents.sources()
        return src[:1] if self.centralized else src

    @property
    def advantage_mode(self) -> str:
        """Resolved advantage mode (trainer.advantage_mode or the algorithm's default)."""
        return self.trainer.advantage_mode or ALGORITHM_ADVANTAGE[self.algorithm]

    def formatter_for(self, agent: int) -> FormatterConfig:
        """The formatter config of one agent."""
        if self.formatters is None:
            return FormatterConfig()
        if isinstance(self.formatters, list):
            return self.formatters[agent]
        return self.formatters

    def model_sources(self) -> list[tuple[str, str]]:
        """Every model source the run loads, as (config field, source)."""
        a = self.agents
        out = [("agents.agents", s) for s in a.agents] if a.agents else [("agents.agent_model", a.agent_model or "")]
        return out + self.trainer.model_sources()

    def resolved_data_dir(self) -> Path:
        """Where artifacts, MLflow and Prefect state live."""
        return data_dir_path(self.data_dir)

    def resolved_remote_store(self) -> str | None:
        """The object-store URL mirroring the artifacts (`remote_store` > $COOPFLOW_REMOTE_STORE), or None."""
        return self.remote_store or os.environ.get("COOPFLOW_REMOTE_STORE") or None

    @field_validator("remote_store")
    @classmethod
    def _remote(cls, v: str | None) -> str | None:
        if v is not None and "://" not in v:
            raise ValueError(f"remote_store {v!r} is not a URL: give an fsspec URL such as s3://bucket/prefix (a "
                             "local or mounted path belongs in data_dir)")
        return v

    @field_validator("data_dir")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        return None if v is None else store_path(v)


class IACRunConfig(RunConfig):
    """A coopflow IAC run: per-agent critics (separate LMs + heads, or a value head on each actor)."""

    algorithm: Literal["iac"] = Field("iac", description="Independent actor-critic.")
    trainer: IACConfig = Field(default_factory=IACConfig, description="Reference IACConfig fields.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Critic model sources.")

    @field_validator("critic", mode="before")
    @classmethod
    def _no_critic(cls, v):
        return {} if v is None else v

    @model_validator(mode="after")
    def _critics(self) -> "IACRunConfig":
        c, n = self.critic, self.agents.n
        given = c.critic_model is not None or c.critics is not None
        if not self.trainer.use_separate_critic:
            if given:
                raise ValueError("critic: critics can only be provided when trainer.use_separate_critic=True")
            return self
        if not given:
            raise ValueError("critic: critics must be provided (critic.critic_model, or critic.critics with one per "
                             "agent) when trainer.use_separate_critic=True")
        if c.critics is not None and len(c.critics) != n:
            raise ValueError(f"critic.critics length {len(c.critics)} must equal num_agents {n}")
        return self

    def model_sources(self) -> list[tuple[str, str]]:
        """The agents' sources, then the critics' (an IAC trainer names no model)."""
        return super().model_sources() + self.critic.model_sources()

    def critic_sources(self) -> list[str]:
        c = self.critic
        return list(c.critics) if c.critics is not None else ([c.critic_model] * self.agents.n if c.critic_model else [])


class MAACRunConfig(RunConfig):
    """A coopflow MAAC run: one centralized critic over the joint history, actors without heads."""

    algorithm: Literal["maac"] = Field("maac", description="Multi-agent actor-critic (centralized critic).")
    trainer: MAACConfig = Field(default_factory=MAACConfig, description="Reference MAACConfig fields.")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="The central critic's source.")

    @field_validator("critic", mode="before")
    @classmethod
    def _no_critic(cls, v):
        return {} if v is None else v

    @model_validator(mode="after")
    def _critic(self) -> "MAACRunConfig":
        c = self.critic
        if c.critics is not None and len(c.critics) != 1:
            raise ValueError(f"critic.critics length {len(c.critics)}: MAAC takes exactly one critic")
        if c.critic_model is None and not c.critics:
            raise ValueError("critic: critics must be provided (critic.critic_model or critic.critics: [one])")
        return self

    def model_sources(self) -> list[tuple[str, str]]:
        """The agents' sources, then the central critic's (a MAAC trainer names no model)."""
        return super().model_sources() + self.critic.model_sources()

    def critic_sources(self) -> list[str]:
        return [self.critic.critic_model or self.critic.critics[0]]  # type: ignore[index]


class MADPORunConfig(RunConfig):
    """A coopflow MADPO run: candidates → scores → pairs → joint-factorized DPO → evaluate."""

    algorithm: Literal["madpo"] = Field("madpo", description="Offline multi-agent DPO.")
    trainer: MADPOConfig = Field(default_factory=MADPOConfig, description="Reference MADPOConfig fields.")


class MARLHFRunConfig(RunConfig):
    """A coopflow MARLHF run: candidates → scores → pairs → joint reward model → online RL on it → evaluate."""

    algorithm: Literal["marlhf"] = Field("marlhf", description="Joint reward model + online MARL.")
    trainer: MARLHFConfig = Field(default_factory=MARLHFConfig, description="Reference MARLHFConfig fields.")


class MADPOIterRunConfig(RunConfig):
    """A coopflow MADPO-iter run: rounds of target-vs-comparator pairs, replay and DPO."""

    algorithm: Literal["madpo-iter"] = Field("madpo-iter", description="Iterative (online) MADPO.")
    trainer: MADPOIterConfig = Field(default_factory=MADPOIterConfig, description="Reference MADPOIterConfig fields.")


class MARLHFIterRunConfig(RunConfig):
    """A coopflow MARLHF-iter run: rounds of target-vs-comparator pairs, replay, a fresh reward model and RL."""

    algorithm: Literal["marlhf-iter"] = Field("marlhf-iter", description="Iterative (online) MARLHF.")
    trainer: MARLHFIterConfig = Field(default_factory=MARLHFIterConfig,
                                      description="Reference MARLHFIterConfig fields.")


RUN_CONFIGS: dict[str, type[RunConfig]] = {"iac": IACRunConfig, "maac": MAACRunConfig, "madpo": MADPORunConfig,
                                           "marlhf": MARLHFRunConfig, "madpo-iter": MADPOIterRunConfig,
                                           "marlhf-iter": MARLHFIterRunConfig}
"""Run config class per algorithm (the MAGRPO family uses RunConfig)."""


def rl_trainer_fields(trainer: MARLHFConfig, rl_algorithm: str) -> dict[str, Any]:
    """The trainer values a MARLHF(-iter) run hands to its `rl_algorithm`'s trainer config: every field the two
    configs share (loss_on_padding included, for the MAGRPO family); for maac/iac critic_learning_rate falls
    back to agent_learning_rate and critic_devices (under mp) to agent_devices; the MAGRPO family gets joint_mode
    'aligned' and advantage_mode null (the algorithm's default)."""
    algo = RL_ALIASES[str(rl_algorithm).lower()]
    target = RUN_CONFIGS.get(algo, RunConfig).model_fields["trainer"].annotation.model_fields
    out = {k: getattr(trainer, k) for k in type(trainer).model_fields if k in target}
    if algo in ("iac", "maac"):
        mp_devices = trainer.agent_devices if trainer.parallel_training == "mp" else None
        out.update(critic_learning_rate=trainer.critic_learning_rate or trainer.agent_learning_rate,
                   critic_devices=trainer.critic_devices or mp_devices)
    else:
        out.update(joint_mode="aligned", advantage_mode=None)
    return out
