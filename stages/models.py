"""Loading, building and saving the agents' causal LMs (no Prefect, no MLflow).

- `build_tiny_model(dir)`: a tiny random Qwen2 causal LM with a BPE tokenizer trained here on a
  small word list, so tests, CI and the quickstart never download anything.
- `resolve_source(src)`: 'tiny' -> the tiny model artifact; a local dir; otherwise an HF id
  (which works when the user has it cached or has network).
- `Policies`: the live per-agent models, tokenizers and AdamW optimizers of one training run;
  `save_checkpoint` / `load_checkpoint` turn it into / from a checkpoint directory
  (`agent_i/` save_pretrained dirs + `optimizer/agent_i.pt` + `trainer_state.json`).
- `LIVE`: an in-process cache so consecutive training segments reuse the in-memory policies
  instead of reloading the checkpoint the previous segment just wrote.
"""

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TINY_WORDS = (
    "once upon a time there was a little fox robot dragon story write explain describe tell about "
    "the ocean city cloud clouds moon star tree rain night day happy sad big small red blue green "
    "old young bird cat dog river mountain forest sun wind snow light dark friend home road ship "
    "and then but so because with without under over into out of from to in on at it was is he she "
    "they we a an one two three very long short end . , !"
).split()


def quiet_transformers() -> None:
    """Silence transformers' load reports and progress bars."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def build_tiny_model(out_dir: str | os.PathLike, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
                     vocab_size: int = 384) -> Path:
    """Write a tiny random Qwen2 LM + locally trained byte-level BPE tokenizer to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    quiet_transformers()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = [" ".join(TINY_WORDS[i:] + TINY_WORDS[:i]) for i in range(len(TINY_WORDS))] * 10
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                     unk_token="<unk>", padding_side="left")
    heads = max(1, hidden_size // 16)
    cfg = Qwen2Config(vocab_size=len(hf_tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                      num_hidden_layers=num_layers, num_attention_heads=heads,
                      num_key_value_heads=max(1, heads // 2), max_position_embeddings=1024,
                      eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id,
                      bos_token_id=hf_tok.eos_token_id, tie_word_embeddings=True)
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


def torch_dtype(name: str):
    """Map a config dtype name to a torch dtype ('auto' passes through)."""
    return "auto" if name == "auto" else getattr(torch, name)


def resolve_device(spec: str) -> torch.device:
    """'auto' -> cuda:0 when available, else cpu."""
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def load_agent(source: str | Path, dtype: str = "float32", attn_implementation: str | None = "sdpa",
               device: str = "cpu"):
    """Load one causal LM and its tokenizer (left padding, pad token ensured)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    src = str(source)
    if (src.startswith((".", "/", "~")) or src.count("/") > 1) and not Path(src).expanduser().is_dir():
        raise FileNotFoundError(f"model directory {src} does not exist")
    kwargs = {"dtype": torch_dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
    except OSError as err:
        raise FileNotFoundError(
            f"cannot load model {src!r}: not a local model directory and not available from the HF cache "
            f"({err.__class__.__name__}); use a local directory or 'tiny'") from None
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    if getattr(model.config, "eos_token_id", None) is None:
        model.config.eos_token_id = tok.eos_token_id
    model.to(resolve_device(device))
    model.eval()
    return model, tok


@dataclass
class Policies:
    """Live agents of one run: models[i], tokenizers[i], optimizers[i] (created on first update)."""

    models: list
    tokenizers: list
    optimizers: list = field(default_factory=list)
    lr: float = 5e-6
    state: dict = field(default_factory=dict)  # update, env_step, ... of the last completed update

    @property
    def n(self) -> int:
        return len(self.models)

    def ensure_optimizers(self) -> None:
        """Per-agent AdamW (the reference's optimizer; fused kernels where torch has them)."""
        if self.optimizers:
            return
        for m in self.models:
            params = [p for p in m.parameters() if p.requires_grad]
            try:
                opt = torch.optim.AdamW(params, lr=self.lr, fused=True)
            except (RuntimeError, TypeError):
                opt = torch.optim.AdamW(params, lr=self.lr)
            self.optimizers.append(opt)


def load_policies(sources: list[str | Path], lr: float, dtype: str = "float32",
                  attn_implementation: str | None = "sdpa", device: str = "cpu") -> Policies:
    """Load every agent from its source dir/id."""
    models, toks = [], []
    for src in sources:
        m, t = load_agent(src, dtype, attn_implementation, device)
        models.append(m)
        toks.append(t)
    return Policies(models=models, tokenizers=toks, lr=lr)


def save_checkpoint(policies: Policies, out: Path, state: dict) -> None:
    """Write agent_i/ (HF dirs), optimizer/agent_i.pt and trainer_state.json into `out`."""
    for i, (m, t) in enumerate(zip(policies.models, policies.tokenizers)):
        m.save_pretrained(out / f"agent_{i}")
        t.save_pretrained(out / f"agent_{i}")
    if policies.optimizers:
        (out / "optimizer").mkdir(exist_ok=True)
        for i, opt in enumerate(policies.optimizers):
            torch.save(opt.state_dict(), out / "optimizer" / f"agent_{i}.pt")
    (out / "trainer_state.json").write_text(json.dumps(state, indent=1, sort_keys=True))


def load_checkpoint(path: Path, n_agents: int, lr: float, dtype: str = "float32",
                    attn_implementation: str | None = "sdpa", device: str = "cpu") -> Policies:
    """Inverse of save_checkpoint: models, tokenizers, optimizer state and trainer state."""
    pol = load_policies([path / f"agent_{i}" for i in range(n_agents)], lr, dtype, attn_implementation, device)
    opt_dir = path / "optimizer"
    if opt_dir.is_dir():
        pol.ensure_optimizers()
        for i, opt in enumerate(pol.optimizers):
            opt.load_state_dict(torch.load(opt_dir / f"agent_{i}.pt", map_location=resolve_device(device)))
    state_file = path / "trainer_state.json"
    pol.state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    return pol


class LivePolicies:
    """One live Policies object, valid for exactly one checkpoint key (in-process reuse)."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.policies: Policies | None = None

    def take(self, key: str) -> Policies | None:
        """Return the live policies if they are exactly checkpoint `key`; the caller now owns them."""
        if self.key == key and self.policies is not None:
            pol, self.key, self.policies = self.policies, None, None
            return pol
        return None

    def put(self, key: str, policies: Policies) -> None:
        self.key, self.policies = key, policies

    def clear(self) -> None:
        self.key, self.policies = None, None


LIVE = LivePolicies()
