"""Run configuration: the single source of truth for every field a coopflow run reads.

A run config is one YAML/JSON document with a few sections:

    algorithm: magrpo            # magrpo | mareinforce | marloo | maremax
    agents:    {agent_model: tiny, num_agents: 2}
    taskset:   {name: story-length-ratio, num_items: 16}
    reward:    {name: length_ratio}
    trainer:   {...}             # the reference's MAGRPOConfig fields, same names and defaults
    seed: 0

`trainer` mirrors CoMLRL 1.4.3's trainer configs (MAGRPOConfig, IACConfig, MAACConfig, MADPOConfig, MARLHFConfig and
the iterative ones) field for field, including their defaults and validations; everything else is pipeline
configuration. Each trainer field is declared once, with one set of limits and one description: `_TrainerBase` holds
the fields every trainer has, `_CriticFields` / `_IACFields` the actor-critic ones (which MARLHF hands to a maac/iac
backend, see `rl_trainer_fields`). A subclass re-declares a field only through `_override`: another default with the
base's limits and description (a changed limit or description is spelt out there). Every model is `extra="forbid"`,
so a misspelt key fails with a message naming it. `load_config` reads a file, applies `--set a.b=c` overrides with
the same dotted paths and validates, before any model loads.
"""

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

ALGORITHM_ADVANTAGE = {"magrpo": "mean", "mareinforce": "raw", "marloo": "rloo", "maremax": "max"}
"""Each MAGRPO-family algorithm is MAGRPO with a different default `advantage_mode`; nothing else differs."""

JOINT_MODE_ALIASES = {"aligned": "aligned", "align": "aligned", "cross": "cross", "crossed": "cross"}

COLLABORATION_ALIASES = {"decentralized": "decentralized", "decentralised": "decentralized",
                         "multi_agent": "decentralized", "multi-agent": "decentralized",
                         "centralized": "centralized", "centralised": "centralized", "single_agent": "centralized",
                         "single-agent": "centralized"}
"""collaboration_mode spellings the reference accepts, mapped to the two modes."""

GENERATION_ALIASES = {**COLLABORATION_ALIASES, "centralized_sequential": "centralized_sequential",
                      "centralised_sequential": "centralized_sequential", "sequential": "centralized_sequential"}
"""comparator_generation_mode spellings, mapped to decentralized | centralized | centralized_sequential."""


def per_agent_values(value: Any, n: int, what: str) -> list:
    """A per-agent setting for each of n agents: one value (or a 1-list) for all, or a list of exactly n."""
    if not isinstance(value, list):
        return [value] * n
    if len(value) == 1:
        return value * n
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} entries for {n} agents")
    return list(value)


def store_path(value: str, what: str = "data_dir") -> str:
    """A data dir given as a path or a `file://` URI, as a path. Other schemes are refused: the store commits by an
    atomic rename, which object storage (s3://, gs://, ...) does not have (see README, "Scale out")."""
    if "://" not in value:
        return value
    from urllib.parse import unquote, urlparse

    u = urlparse(value)
    if u.scheme != "file":
        raise ValueError(f"{what} {value!r}: a {u.scheme}:// data dir is not supported (the local store commits by an "
                         "atomic rename, which object storage lacks): keep data_dir a local path (or a shared POSIX "
                         f"mount) and set remote_store: {value} to mirror the artifacts to object storage")
    if u.netloc not in ("", "localhost"):
        raise ValueError(f"{what} {value!r}: a file:// URI names this machine's files (file:///path); mount "
                         f"{u.netloc}'s share locally instead")
    return unquote(u.path)


def data_dir_path(value: str | None) -> Path:
    """The data dir: `value` > $COOPFLOW_HOME > ./.coopflow (paths or file:// URIs), absolute."""
    raw = value or os.environ.get("COOPFLOW_HOME") or ".coopflow"
    return Path(store_path(raw, "data_dir" if value else "COOPFLOW_HOME")).expanduser().resolve()


def is_local_model_path(src: str) -> bool:
    """A model source that can only be a local directory ('./x', '/x', '~/x', 'a/b/c'; not 'tiny' or 'org/name')."""
    return src.startswith((".", "/", "~")) or src.count("/") > 1


def missing_model_dir_message(what: str, src: str) -> str:
    """The error for a local model source whose directory does not exist (`what`: the config field)."""
    return (f"{what}: model directory {src!r} does not exist (a source is 'tiny', an existing local directory or a "
            "Hugging Face model id like 'org/name')")


def _alias(v: Any, aliases: dict[str, str], what: str, choices: str) -> str:
    """A setting's canonical name from its (case-insensitive) spellings; a ValueError naming the choices."""
    key = str(v).lower()
    if key not in aliases:
        raise ValueError(f"{what} must be {choices}; got {v!r}")
    return aliases[key]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- agents --------------------------------------------------------------------------------------


class LoraSettings(_Strict):
    """Per-agent LoRA adapters on one shared, frozen base model (needs `pip install 'coopflow[lora]'`)."""

    r: int = Field(8, ge=1, description="Rank of each adapter's update matrices.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (the update is scaled by alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input during training.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get an adapter (the attention projections of Qwen2/Llama/Mistral models).")


class AgentsConfig(_Strict):
    """Which causal LMs act as agents: `agent_model` alone is copied to all N agents, `agents` alone gives one per
    agent (N = its length); both only if `agents` lists N copies of `agent_model`."""

    agent_model: str | None = Field(
        None, description="One model for all agents (homogeneous): 'tiny' (built locally), a local dir or an HF id.")
    agents: list[str] | None = Field(
        None, description="One model per agent (heterogeneous): local dirs or HF ids; length must equal num_agents.")
    num_agents: int | None = Field(
        None, ge=1, description="Number of agents N; defaults to len(agents), else 2 (the reference's default).")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weight dtype when loading the agents ('auto' keeps the checkpoint's dtype).")
    attn_implementation: str | None = Field(
        "sdpa", description="Attention kernel passed to from_pretrained; null leaves the model's default.")
    device: str = Field("cpu", description="Torch device for every agent ('cpu', 'cuda', 'cuda:0', 'auto').")
    generation_backend: Literal["auto", "hf"] = Field(
        "auto", description="How agents sample: 'auto' = coopflow's KV-cache loop for Llama-family models "
                            "(Qwen2/Llama/Mistral; same tokens as generate for the same seed), else "
                            "transformers' generate; 'hf' = always generate.")
    compute_dtype: Literal["model", "bfloat16", "float16", "auto"] = Field(
        "model", description="Dtype of the matmuls (weights and optimizer state stay in agents.dtype): the decode "
                             "loop's projections and the policy/DPO/actor loss forward (autocast). model = the "
                             "weights' own; bfloat16 = half the bytes per decoded token and faster loss passes on "
                             "CPUs with AVX512-BF16/AMX and on GPUs; auto = bfloat16 where the device has native "
                             "bf16 matmuls, else model. Changes samples and updates slightly (new cache keys).")
    decode_step: Literal["auto", "dynamic", "static", "cuda_graph"] = Field(
        "auto", description="How the KV-cache loop runs each decode step (the same tokens every way): dynamic = "
                            "attention over the filled cache; static = fixed shapes, the whole cache masked; "
                            "cuda_graph = the static step captured once per call as a CUDA graph and replayed per "
                            "token (CUDA only); auto = cuda_graph on a CUDA device, else dynamic.")
    prompt_overflow: Literal["error", "truncate"] = Field(
        "error", description="A prompt that leaves no room for max_new_tokens in the model's context: error (naming "
                             "it) | truncate (keep its last tokens, with a warning).")
    tiny_hidden_size: int = Field(64, ge=8, description="Hidden size of the built-in 'tiny' model.")
    tiny_num_layers: int = Field(2, ge=1, description="Layer count of the built-in 'tiny' model.")
    torch_threads: int | None = Field(
        None, ge=1, description="Torch intra-op threads of this run (mp workers split them); null = automatic: the "
                                "CPUs this process may use (affinity, cgroup quota) // the runs `coopflow serve` "
                                "runs at once, or OMP_NUM_THREADS when exported.")
    lora: LoraSettings | None = Field(
        None, description="Train a LoRA adapter per agent on a frozen base (all agents the same model; in-process "
                          "they share one copy of the base, mp workers / Ray actors each hold one); checkpoints hold "
                          "adapters only (`coopflow merge-lora` exports full models). null = full fine-tuning.")

    @model_validator(mode="after")
    def _resolve(self) -> "AgentsConfig":
        if self.agent_model is None and not self.agents:
            raise ValueError("set agents.agent_model (homogeneous) or agents.agents (a list, heterogeneous)")
        if self.agents is not None:
            if any(not isinstance(a, str) or not a.strip() for a in self.agents):
                raise ValueError("agents.agents entries must be non-empty model names or directories")
            n = self.num_agents if self.num_agents is not None else len(self.agents)
            if len(self.agents) != n:
                raise ValueError(f"agents.agents has {len(self.agents)} entries but num_agents is {n}")
            if self.agent_model is not None and any(a != self.agent_model for a in self.agents):
                raise ValueError("conflict: agents.agents must list num_agents copies of agents.agent_model "
                                 "when both are given (or drop agent_model for heterogeneous agents)")
        if self.lora is not None and len(set(self.sources())) > 1:
            raise ValueError("agents.lora shares one base model between the agents: they must all be the same model "
                             f"(got {sorted(set(self.sources()))})")
        return self

    @property
    def n(self) -> int:
        """The resolved number of agents."""
        if self.num_agents is not None:
            return self.num_agents
        return len(self.agents) if self.agents else 2

    def sources(self) -> list[str]:
        """One model source per agent."""
        return list(self.agents) if self.agents else [self.agent_model] * self.n  # type: ignore[list-item]


# --- taskset -------------------------------------------------------------------------------------


class TasksetConfig(_Strict):
    """Where the task items come from (built-in name, local file or HF `datasets` dataset)."""

    name: str = Field("story-length-ratio",
                      description="Built-in taskset name, a local .parquet/.jsonl/.json/.csv file, a dir saved by "
                                  "datasets' save_to_disk, or 'hf:<dataset id>'.")
    split: str = Field("train", description="Split to train on (for files: all rows, less those eval_fraction "
                                            "holds out; for HF datasets: the split name).")
    eval_split: str | None = Field(
        None, description="Split to evaluate on; null uses the source's own eval split, else eval_fraction / "
                          "eval_file, else the training items (with a warning).")
    prompt_column: str = Field("prompt", description="Column holding the prompt text.")
    prompt_template: str | None = Field(
        None, description="Python format string over the row's columns that builds the prompt, e.g. 'Summarize: {text}'.")
    num_items: int | None = Field(None, ge=1, description="Use only the first N training items (null: all).")
    num_eval_items: int | None = Field(None, ge=1, description="Use only the first N eval items (null: all).")
    eval_fraction: float | None = Field(
        None, ge=0.0, lt=1.0, description="Hold out this fraction of a source without an eval split of its own (a "
                                          "file, an hf: split) as the eval split, chosen by a seeded hash of each row.")
    eval_file: str | None = Field(
        None, description="A separate .parquet/.jsonl/.json/.csv file of eval items (same columns) for a source "
                          "without an eval split of its own; its ids must not repeat training ids.")
    eval_split_seed: int = Field(0, description="Seed of the eval_fraction hash: another seed holds out other rows.")

    @model_validator(mode="after")
    def _held_out(self) -> "TasksetConfig":
        if self.eval_fraction is not None and self.eval_file is not None:
            raise ValueError("taskset.eval_fraction and taskset.eval_file both set: choose one held-out eval split")
        if self.eval_fraction == 0.0:
            raise ValueError("taskset.eval_fraction 0 holds out nothing: leave it null to evaluate on the training "
                             "items, or set a fraction in (0, 1)")
        given = "eval_fraction" if self.eval_fraction is not None else "eval_file" if self.eval_file else None
        if given and self.eval_split is not None:
            raise ValueError(f"taskset.{given} and taskset.eval_split both set: eval_split names the source's own "
                             f"eval split, {given} makes one from a source without it")
        if self.eval_file is not None and not self.eval_file.strip():
            raise ValueError("taskset.eval_file is empty: give a file path or null")
        return self

    def key_fields(self) -> dict:
        """The fields a taskset key holds: the held-out-split fields only when set, so the keys of configs without
        them are those they had before these fields existed."""
        data = self.model_dump()
        for name in ("eval_fraction", "eval_file"):
            if data[name] is None:
                data.pop(name)
        if self.eval_fraction is None:  # the seed only matters to a fraction's split
            data.pop("eval_split_seed")
        return data


# --- reward --------------------------------------------------------------------------------------


class RewardConfig(_Strict):
    """The shared reward of a joint action: one float for one completion per agent (a team reward)."""

    name: str = Field("length_ratio", description="Built-in reward name or an import path 'module:function'.")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="Keyword arguments bound to the reward function (functools.partial).")
    processor: str | None = Field(
        None, description="Reward processor: identity | clamp:MIN:MAX | scale:F | shift:V | sigmoid_scale | "
                          "exponential_scale:F | normalize_by_length:MAX | 'module:function'.")
    timeout_s: float | None = Field(
        300.0, gt=0, description="Seconds one reward call may take before the run fails with an error naming the "
                                 "reward (a hung reward never blocks a run forever); null = no limit.")
    retries: int = Field(0, ge=0, description="Retries of a reward call that raised (for rewards calling flaky "
                                              "services), after 0.5 s, 1 s, 2 s, ...; a timeout is not retried.")
    workers: int = Field(1, ge=1, description="Reward calls run at once: 1 = serially in this process; N > 1 fans "
                                              "each scoring stage's calls out to `executor` (scores identical).")
    executor: Literal["process", "dask", "ray"] = Field(
        "process", description="Where reward calls run when workers > 1: process (a local pool of N processes; the "
                               "reward must be importable by name), dask (Dask distributed: executor_address, or a "
                               "local cluster of N workers) or ray (Ray tasks, N in flight; the `ray` section's "
                               "cluster).")
    executor_address: str | None = Field(None, description="Dask scheduler address (tcp://host:8786) for executor "
                                                           "dask; null = a local cluster started for the run.")
    reward_range: tuple[float, float] | None = Field(
        None, description="Declared [min, max] of the raw reward; null uses the function's `reward_range` attribute "
                          "(set_reward_range) if any. Used to warn when early termination makes turns unreachable.")

    @field_validator("reward_range")
    @classmethod
    def _range(cls, v):
        if v is not None and not (all(map(lambda x: x == x and abs(x) != float("inf"), v)) and v[0] < v[1]):
            raise ValueError(f"reward_range must be finite [min, max] with min < max, got {list(v)}")
        return v


# --- transition (multi-turn) ---------------------------------------------------------------------


class TransitionConfig(_Strict):
    """The environment step between turns: builds each agent's next prompt from the last joint answer."""

    name: str = Field("plain", description="plain (show the previous answers, ask to revise) | feedback (also tell "
                                           "the agents the joint answer's score and lengths) | 'module:function'.")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="Keyword arguments bound to the transition (e.g. instruction: '...').")


# --- formatters ----------------------------------------------------------------------------------


class FormatterConfig(_Strict):
    """How an agent's prompt is built from a task item (one formatter for all agents, or one per agent)."""

    template: str | None = Field(
        None, description="Python format string over the item's fields, e.g. 'Write briefly: {prompt}'. "
                          "null uses item['prompt'] unchanged.")
    function: str | None = Field(None, description="Import path 'module:function' of a formatter f(item) -> str.")
    chat_template: bool = Field(False, description="Wrap the prompt in the tokenizer's chat template as a user turn.")
    system_prompt: str | None = Field(None, description="System message used with chat_template.")

    @model_validator(mode="after")
    def _one(self) -> "FormatterConfig":
        if self.template is not None and self.function is not None:
            raise ValueError("a formatter takes either template or function, not both")
        return self


# --- trainers: shared field sets -------------------------------------------------------------------


_LIMITS = ("ge", "gt", "le", "lt")


def field_limits(f: FieldInfo) -> dict[str, Any]:
    """A field's numeric limits, e.g. {'ge': 1}."""
    return {k: getattr(m, k) for m in f.metadata for k in _LIMITS if hasattr(m, k)}


def _override(base: type[BaseModel], name: str, default: Any, description: str | None = None, **limits: Any) -> Any:
    """`base`'s field `name` with another default; its limits and description are kept unless given."""
    f = base.model_fields[name]
    return Field(default, description=description or f.description, **(field_limits(f) | limits))


def _parallel_mode(v: str | None) -> str:
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
        return _parallel_mode(v)

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
    loss_on_padding: bool = Field(
        True, description="The reference's exact loss: each completion padded to its node's longest with pad tokens, "
                          "pads scored, each padded row's last token not (CoMLRL 1.4.3); false: every completion "
                          "token up to EOS is scored and pads never are.")
    loss_chunk_tokens: int | None = Field(
        None, ge=1, description="Cap a loss forward at this many padded tokens (rows × longest): the minibatch runs "
                                "as length-sorted chunks whose gradients add up before its one AdamW step, so peak "
                                "activation memory follows the chunk (and sorted chunks pad less); null = the whole "
                                "minibatch in one forward.")
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


class CriticConfig(_Strict):
    """Critic model sources: IAC separate critics take one per agent (or one, broadcast), MAAC exactly one."""

    critic_model: str | None = Field(None, description="One critic source ('tiny', a local dir or an HF id); IAC "
                                                       "broadcasts it to every agent.")
    critics: list[str] | None = Field(None, description="Critic sources: one per agent (IAC) or exactly one (MAAC).")
    refit_epochs: int = Field(1, ge=1, description="Passes over a run's stored ac_samples when the 'critic' stage "
                                                   "re-fits its trained critic(s).")
    refit_learning_rate: float | None = Field(None, gt=0, description="Learning rate of the re-fit; null = "
                                                                       "trainer.critic_learning_rate.")


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
    sample_rollouts: int = Field(16, ge=0, description="Rollout rows saved as a run artifact (JSON) per run.")


class RunConfig(_Strict):
    """A full coopflow run of the MAGRPO family."""

    algorithm: Literal["magrpo", "mareinforce", "marloo", "maremax"] = Field(
        "magrpo", description="Which MAGRPO-family algorithm (sets the default advantage_mode).")
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
        return getattr(self.trainer, "collaboration_mode", "decentralized") == "centralized"

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
        critic = getattr(self, "critic", None)
        if critic is not None:
            out += [("critic.critics", s) for s in critic.critics or []]
            out += [("critic.critic_model", critic.critic_model)] if critic.critic_model else []
        for name in ("reward_model_name", "comparator_model_name"):
            if getattr(self.trainer, name, None):
                out.append((f"trainer.{name}", getattr(self.trainer, name)))
        out += [("trainer.comparator_agents", s) for s in getattr(self.trainer, "comparator_agents", None) or []]
        return out

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

    def critic_sources(self) -> list[str]:
        return [self.critic.critic_model or self.critic.critics[0]]  # type: ignore[index]


# --- preference learning (the reference's MADPOConfig / MARLHFConfig) ------------------------------


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


class MADPORunConfig(RunConfig):
    """A coopflow MADPO run: candidates → scores → pairs → joint-factorized DPO → evaluate."""

    algorithm: Literal["madpo"] = Field("madpo", description="Offline multi-agent DPO.")
    trainer: MADPOConfig = Field(default_factory=MADPOConfig, description="Reference MADPOConfig fields.")


class MARLHFRunConfig(RunConfig):
    """A coopflow MARLHF run: candidates → scores → pairs → joint reward model → online RL on it → evaluate."""

    algorithm: Literal["marlhf"] = Field("marlhf", description="Joint reward model + online MARL.")
    trainer: MARLHFConfig = Field(default_factory=MARLHFConfig, description="Reference MARLHFConfig fields.")


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


class MADPOIterConfig(MADPOConfig):
    """CoMLRL 1.4.3 `MADPOIterConfig`: rounds of target-vs-comparator pairs, replay, DPO."""

    num_iterations: int = Field(6, ge=1, description="Rounds (iterations); a scheduled run adds rounds up to this.")
    num_train_epochs: int = _override(MADPOConfig, "num_train_epochs", 1, "DPO passes over each round's training "
                                                                          "pairs.")
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
    def _post_iter(self) -> "MADPOIterConfig":
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


class MADPOIterRunConfig(RunConfig):
    """A coopflow MADPO-iter run: rounds of target-vs-comparator pairs, replay and DPO."""

    algorithm: Literal["madpo-iter"] = Field("madpo-iter", description="Iterative (online) MADPO.")
    trainer: MADPOIterConfig = Field(default_factory=MADPOIterConfig, description="Reference MADPOIterConfig fields.")


class MARLHFIterConfig(MADPOIterConfig, MARLHFConfig):
    """CoMLRL 1.4.3 `MARLHFIterConfig`: per round a fresh joint reward model on the round's training
    pairs, then the RL backend on it."""

    num_train_epochs: int = _override(MADPOIterConfig, "num_train_epochs", 2, "RL epochs per round (over the "
                                                                              "training items).")
    num_generations: int = MARLHFConfig.model_fields["num_generations"]  # not MADPOIterConfig's (MAGRPO's, >= 2)
    reward_num_train_epochs: int = _override(MARLHFConfig, "reward_num_train_epochs", 2, "Passes over the round's "
                                             "training pairs when fitting its fresh reward model.")
    preference_scoring_reward: Literal["task", "reward_model"] = Field(
        "task", description="What scores a round's candidates for its pairs: task | reward_model (the previous "
                            "round's reward model; round 1 falls back to the task reward).")


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


# --- loading and overrides -----------------------------------------------------------------------


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending field."""


def _parse_value(text: str) -> Any:
    """Parse an override value: YAML scalars/lists/maps ('1e-3', 'true', 'null', '[a, b]')."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str] | dict[str, Any] | None) -> dict:
    """Apply `a.b.c=value` overrides (or a {dotted: value} dict) to a nested dict, in place."""
    items = overrides.items() if isinstance(overrides, dict) else []
    if isinstance(overrides, list):
        pairs = []
        for ov in overrides:
            if "=" not in ov:
                raise ConfigError(f"override {ov!r} must look like key.path=value")
            k, v = ov.split("=", 1)
            pairs.append((k.strip(), _parse_value(v)))
        items = pairs
    for key, value in items:
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
            node = node[p]
        node[parts[-1]] = value
    return data


def format_validation_error(err: ValidationError) -> str:
    """One readable line per problem, each naming the dotted field path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        show = e["type"] != "missing" and not isinstance(got, dict) and repr(got) not in msg
        lines.append(f"{loc or '<config>'}: {msg}" + (f" (got {got!r})" if show else ""))
    return "invalid config: " + "; ".join(lines)


def validate_config(data: dict, algorithm: str | None = None) -> RunConfig:
    """Validate a config dict; raises ConfigError naming the field."""
    data = dict(data)
    if algorithm is not None:
        if data.get("algorithm") not in (None, algorithm):
            raise ConfigError(f"algorithm: config says {data['algorithm']!r} but the flow is train-{algorithm}")
        data["algorithm"] = algorithm
    cls = RUN_CONFIGS.get(str(data.get("algorithm")), RunConfig)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a YAML or JSON config file into a dict."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"cannot parse config file {p}:{err.lineno}:{err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:  # one line: file:line:column: what the parser expected
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(f"cannot parse config file {p}{where}: {what}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None,
                algorithm: str | None = None, base: dict | None = None) -> RunConfig:
    """File (optional) + base dict (optional) + overrides -> validated RunConfig."""
    data: dict = {}
    if path is not None:
        data = read_config_file(path)
    if base:
        data = _deep_merge(data, base)
    data = apply_overrides(data, overrides)
    return validate_config(data, algorithm)


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
