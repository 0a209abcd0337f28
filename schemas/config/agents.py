"""The `agents` section: which causal LMs act as agents, and their optional per-agent LoRA adapters."""

from typing import Literal

from pydantic import Field, model_validator

from coopflow.schemas.config.common import _Strict



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
                             "loop's projections (with bf16 also its KV cache and attention on CPUs with AMX and "
                             "on GPUs, and each token drawn from the top-k survivors) and the policy/DPO/actor "
                             "loss forward (autocast; its attention in float32 on CPUs without AMX, where "
                             "that is the faster kernel). model = the weights' own (generate's tokens); bfloat16 = "
                             "half the bytes per decoded token and faster loss passes on CPUs with AVX512-BF16/AMX "
                             "and on GPUs; auto = bfloat16 where the device has native bf16 matmuls, else model. "
                             "Changes samples and updates slightly (new cache keys).")
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
