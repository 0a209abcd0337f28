"""Loading, building and saving the agents' causal LMs (no Prefect, no MLflow).

- `build_tiny_model(dir)`: a tiny random Qwen2 causal LM with a BPE tokenizer trained here on a
  small word list, so tests, CI and the quickstart never download anything.
- `load_agent(source)`: one causal LM + tokenizer from a local dir or an HF id (which works when the
  user has it cached or has network), left padding and a pad token ensured.
- `load_agent_state` / `load_policies` / `load_critic`: the live per-agent state of a run (models,
  frozen references, value heads, critics, optimizer state); `save_agent` (a per-agent op) and
  `save_checkpoint` write them in the layout of `stages.agents.checkpoint`.
"""

import json
import logging
import os
import struct
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from pathlib import Path

import torch

from coopflow.artifacts import faults
from coopflow.artifacts.direct import DirectFile
from coopflow.artifacts.store import file_digest, sync_files
from coopflow.stages.agents.checkpoint import CheckpointLayout
from coopflow.stages.agents.state import AgentState, CriticState, Policies, write_beside
from coopflow.stages.agents.spec import AgentSpec

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


# --- LoRA adapter dirs (written by stages.agents.lora) --------------------------------------------

LORA_FILE = "coopflow_lora.json"  # in an adapter dir: the base model it was trained on


def is_adapter_dir(path: str | Path) -> bool:
    """A directory holding a LoRA adapter (and no full model)."""
    p = Path(str(path))
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter dir was trained on (recorded at save time)."""
    f = Path(str(path)) / LORA_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{path} is a LoRA adapter without {LORA_FILE}: its base model is unknown")
    return json.loads(f.read_text())["base"]


def load_merged(adapter_dir: str | Path, dtype: str = "float32", attn: str | None = "sdpa", device: str = "cpu",
                base: str | None = None):
    """(model, tokenizer) of base + adapter merged into plain weights (a frozen copy, or for export)."""
    from peft import PeftModel

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)  # PEFT's
    own_tok = None
    if (Path(str(adapter_dir)) / "tokenizer_config.json").is_file():  # the agent's tokenizer, saved beside it
        from transformers import AutoTokenizer

        own_tok = AutoTokenizer.from_pretrained(str(adapter_dir))
    model, tok = load_agent(base or adapter_base(adapter_dir), dtype, attn, device, tokenizer=own_tok)
    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload(), tok


def save_adapter(agent: AgentState, out: Path) -> None:
    """Write agent's adapter (PEFT's format) and the name of its base into `out`."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    sd = get_peft_model_state_dict(agent.model, adapter_name=agent.adapter)
    save_file({k: v.detach().contiguous().cpu() for k, v in sd.items()}, str(out / "adapter_model.safetensors"))
    agent.model.peft_config[agent.adapter].save_pretrained(str(out))
    (out / LORA_FILE).write_text(json.dumps({"base": agent.base_source, "adapter": agent.adapter}, indent=1))


def torch_dtype(name: str):
    """Map a config dtype name to a torch dtype ('auto' passes through)."""
    return "auto" if name == "auto" else getattr(torch, name)


def resolve_device(spec: str) -> torch.device:
    """'auto' -> cuda:0 when available, else cpu."""
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def load_tensors(path: str | Path, device: str = "cpu"):
    """A torch-saved state dict (optimizer state) as tensors and plain containers only: `weights_only`, so a
    crafted pickle in a checkpoint can run no code; refused with the file named."""
    import pickle

    try:
        return torch.load(path, map_location=resolve_device(device), weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path} holds objects other than tensors and plain containers; refusing to load it "
                         f"({str(err).splitlines()[0][:200]})") from None


def load_agent(source: str | Path, dtype: str = "float32", attn_implementation: str | None = "sdpa",
               device: str = "cpu", tokenizer=None):
    """Load one causal LM and its tokenizer (left padding, pad token ensured); a given `tokenizer` is used
    instead of loading the source's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    src = str(source)
    if (src.startswith((".", "/", "~")) or src.count("/") > 1) and not Path(src).expanduser().is_dir():
        raise FileNotFoundError(f"model directory {src} does not exist")
    if is_adapter_dir(src):  # a LoRA agent of a checkpoint (stages.agents.lora): its base with the adapter merged in
        model, tok = load_merged(src, dtype, attn_implementation, device)
        model.eval()
        return model, (tokenizer if tokenizer is not None else tok)
    kwargs = {"dtype": torch_dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(src)
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


def load_critic(source: str | Path, lr: float, head_dim: int | None, dtype: str = "float32",
                attn_implementation: str | None = "sdpa", device: str = "cpu", optimizer_file: Path | None = None,
                actor_tokenizer=None, head_seed: int | None = None) -> CriticState:
    """A critic from a model source; its value head from `source/value_head.pt` when there, else fresh."""
    from coopflow.stages.agents.value_heads import load_head, new_head

    model, tok = load_agent(source, dtype, attn_implementation, device)
    head = load_head(Path(source), resolve_device(device)) if Path(str(source)).is_dir() else None
    crit = CriticState(model, head or new_head(model, head_dim, head_seed), tok, lr)
    if actor_tokenizer is not None:
        crit.same_vocab = actor_tokenizer.get_vocab() == tok.get_vocab()
    if optimizer_file is not None and Path(optimizer_file).is_file():
        crit.ensure_optimizer().load_state_dict(load_tensors(optimizer_file, device))
    return crit


def save_optimizer(optimizer, path: Path) -> str:
    """An optimizer's state dict as a torch file at `path`; returns the file's `file_digest`. Written around the
    page cache and hashed on the way (`artifacts.direct.DirectFile`: the state is read back only to resume), and
    without torch.save's per-record CRC32 (set in this thread only: torch keeps the option per thread): the store's
    manifest of file digests already checks every byte of a checkpoint on read, and the CRC was most of the write
    (1.1 GB of AdamW state: 1.0-2.3 s with it, 0.3 s without). torch.load reads such files as usual."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        with DirectFile(path) as f:
            torch.save(optimizer.state_dict(), f)
        return f.digest
    finally:
        torch.serialization.set_crc32_options(before)


def save_tokenizer(tok, out: Path) -> None:
    """`tok.save_pretrained(out)` with the padding and truncation its last call left on the fast tokenizer's backend
    left out of tokenizer.json (transformers sets both per call, so they are not part of the tokenizer): the saved
    files depend on the tokenizer alone, not on whether its last use padded a batch. The live tokenizer is not
    touched (a copy of its backend, cleared, replaces the tokenizer.json just written, whatever state that one
    caught: a generation may be tokenizing beside a checkpoint write)."""
    tok.save_pretrained(out)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not (Path(out) / "tokenizer.json").is_file():
        return
    from tokenizers import Tokenizer

    snapshot = Tokenizer.from_str(backend.to_str())
    snapshot.no_padding()
    snapshot.no_truncation()
    snapshot.save(str(Path(out) / "tokenizer.json"))


def save_critic(crit: CriticState, out: Path, optimizer_file: Path | None = None) -> dict[Path, str]:
    """An HF dir with the critic LM, its tokenizer and value_head.pt (+ its optimizer state); the digests of the
    files it hashed as it wrote them (the optimizer state's)."""
    from coopflow.stages.agents.value_heads import save_head

    crit.model.save_pretrained(out)
    save_tokenizer(crit.tokenizer, out)
    save_head(crit.head, out)
    if crit.optimizer is not None and optimizer_file is not None:
        optimizer_file.parent.mkdir(exist_ok=True)
        return {optimizer_file: save_optimizer(crit.optimizer, optimizer_file)}
    return {}


def load_agent_state(spec: AgentSpec) -> AgentState:
    """Load one agent as its spec says: the model, its frozen reference, IAC's value head or critic, and its
    optimizer state when a checkpoint has one. (A LoRA agent is loaded by `stages.agents.lora`.)"""
    model, tok = load_agent(spec.source, spec.dtype, spec.attn, spec.device)
    faults.hit("prepare")  # (tests: killed while the agents' models are being prepared)
    agent = AgentState(model, tok, spec.lr)
    if spec.reference is not None:
        ref, _ = load_agent(spec.reference, spec.dtype, spec.attn, spec.reference_device or spec.device)
        ref.requires_grad_(False)
        agent.reference = ref
    attach_actor_critic(agent, spec.source, spec)
    load_optimizer_state(agent, spec.optimizer_file, spec.device)
    return agent


def load_optimizer_state(agent: AgentState, optimizer_file: str | Path | None, device: str) -> None:
    """Restore an agent's AdamW state from a checkpoint's file (nothing when there is none: a fresh optimizer)."""
    if optimizer_file is not None and Path(optimizer_file).is_file():
        agent.ensure_optimizer().load_state_dict(load_tensors(optimizer_file, device))


def attach_actor_critic(agent: AgentState, source: str | Path, spec: AgentSpec) -> None:
    """Give an agent the value head or separate critic its spec asks for (nothing for other runs)."""
    if spec.value_head is not None:
        from coopflow.stages.agents.value_heads import load_head, new_head

        src = Path(str(source))
        agent.value_head = load_head(src, resolve_device(spec.device)) if src.is_dir() else None
        agent.value_head = agent.value_head or new_head(agent.model, spec.value_head.hidden_dim, spec.value_head.seed)
    if spec.critic is not None:
        c = spec.critic
        agent.critic = load_critic(c.source, c.lr, c.head_dim, spec.dtype, spec.attn, c.device or spec.device,
                                   Path(c.optimizer_file) if c.optimizer_file else None, agent.tokenizer, c.seed)


# --- weights files written around the page cache -------------------------------------------------------------

_DIRECT = threading.local()  # .hashed: where this thread's save_pretrained reports the files it wrote directly
_SAFE_SAVE = None  # transformers' own safetensors writer, once `_weights_written_direct` has wrapped it
_WRAP_LOCK = threading.Lock()


_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


def _safe_save(tensors, filename, metadata=None):
    """transformers' safetensors writer inside `_weights_written_direct` (on this thread): the file written from the
    tensors' own memory through `DirectFile` (no copy of the weights), its digest reported; elsewhere, or for
    tensors this writer does not lay out (mixed or other dtypes, not contiguous, not on the CPU), the original."""
    hashed = getattr(_DIRECT, "hashed", None)
    dtypes = {t.dtype for t in tensors.values()}
    if (hashed is None or len(dtypes) != 1 or dtypes.pop() not in _ST_DTYPES
            or not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors.values())):
        return _SAFE_SAVE(tensors, filename, metadata=metadata)
    hashed[Path(filename)] = _write_safetensors(tensors, filename, metadata)


def _write_safetensors(tensors: dict, filename, metadata: dict | None) -> str:
    """The safetensors file of one-dtype CPU tensors as the safetensors library lays it out — an 8-byte little-endian
    header length, the JSON header (metadata first, then the tensors by name with their byte ranges) padded with
    spaces to a multiple of 8, then the tensors' bytes in that order — written with `DirectFile`; its digest."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    names, offset = sorted(tensors), 0
    for name in names:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    head += b" " * (-len(head) % 8)
    with DirectFile(filename) as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name in names:
            f.write(tensors[name].detach().reshape(-1).view(torch.uint8).numpy())
    return f.digest


@contextmanager
def _weights_written_direct(hashed: dict[Path, str]):
    """Inside: `save_pretrained` on this thread writes its safetensors files with `_write_safetensors`, around the
    page cache (the weights are read back only to resume or evaluate; through the page cache each 4 KB first takes
    a fresh page, the slowest part of the write on the machines measured), and records their digests in `hashed`.
    Other threads and code outside are left to transformers' own writer."""
    global _SAFE_SAVE
    from transformers import modeling_utils

    with _WRAP_LOCK:
        if _SAFE_SAVE is None:
            _SAFE_SAVE = modeling_utils.safe_save_file
            modeling_utils.safe_save_file = _safe_save
    before, _DIRECT.hashed = getattr(_DIRECT, "hashed", None), hashed
    try:
        yield
    finally:
        _DIRECT.hashed = before


def save_agent(agent: AgentState, out: Path, index: int) -> dict[Path, str]:
    """Per-agent op: write agent i's part of the checkpoint at `out` (model, tokenizer, optimizer, heads, critic);
    the digests of the files hashed as they were written (weights and optimizer states), by path."""
    lay = CheckpointLayout(Path(out))
    hashed: dict[Path, str] = {}
    if agent.adapter is not None:  # LoRA: the adapter only (the base is shared and unchanged)
        save_adapter(agent, lay.agent(index))
    else:
        with _weights_written_direct(hashed):
            agent.model.save_pretrained(lay.agent(index))
    save_tokenizer(agent.tokenizer, lay.agent(index))
    if agent.optimizer is not None:
        lay.optimizer_dir.mkdir(exist_ok=True)
        hashed[lay.agent_optimizer(index)] = save_optimizer(agent.optimizer, lay.agent_optimizer(index))
    if agent.value_head is not None:
        from coopflow.stages.agents.value_heads import save_head

        save_head(agent.value_head, lay.agent(index))
    if agent.critic is not None:
        hashed.update(save_critic(agent.critic, lay.agent_critic(index), lay.agent_critic_optimizer(index)))
    return hashed


def load_policies(specs: list[AgentSpec]) -> Policies:
    """Every agent in this process, one after the other, as its spec says."""
    return Policies([load_agent_state(spec) for spec in specs])


def begin_save(agent: AgentState, out: Path, index: int) -> None:
    """Per-agent op: start writing agent i's part of the checkpoint at `out` on a writer thread of the process that
    holds it, reading the weights and optimizer state in place (no copy): the agent's next optimizer step waits for
    it (`AgentState.ensure_optimizer`). In-process LoRA agents (one model, adapters switched per agent) write now."""
    if agent.writing is not None:  # an earlier write nobody collected (another agent's write failed first)
        futures_wait([agent.writing])
    if agent.activate is not None:
        agent.writing = Future()
        agent.writing.set_result(_save_and_hash(agent, out, index))
    else:
        agent.writing = write_beside(_save_and_hash, agent, out, index)


def _save_and_hash(agent: AgentState, out: Path, index: int) -> tuple[dict[str, str], float]:
    """Write agent i's part, hash its files and flush them to the disk (here, on the writer thread: a checkpoint
    written beside the next phase does not wait for the disk at its commit): (their digests, when it ended as
    time.time())."""
    hashed = save_agent(agent, out, index)
    faults.hit(f"checkpoint-write/agent{index}")  # (tests: killed while a checkpoint is written beside the next phase)
    files = CheckpointLayout(Path(out)).agent_files(index)
    digests = {str(f.relative_to(out)): hashed.get(f) or file_digest(f) for f in files}
    sync_files(files)
    return digests, time.time()


def wait_save(agent: AgentState) -> None:
    """Per-agent op: wait for `begin_save`'s write to end (its error is left for `finish_save`)."""
    if agent.writing is not None:
        futures_wait([agent.writing])


def finish_save(agent: AgentState) -> tuple[dict[str, str], float]:
    """Per-agent op: the digest of every file `begin_save` wrote (relative to the checkpoint) and when the write
    ended (time.time()), once written; raises the write's error."""
    future, agent.writing = agent.writing, None
    return future.result() if future is not None else ({}, time.time())


def begin_checkpoint(policies, out: Path, state: dict) -> Callable[[], dict[str, str]]:
    """Start writing a whole checkpoint into `out`: each agent's part where it lives, beside whatever the caller does
    next (`begin_save`); MAAC's central critic and the trainer state now. Returns `finish()`, which waits for every
    agent's write and returns the digests of their files (`ArtifactStore.put_dir_behind` commits with them)."""
    lay = CheckpointLayout(Path(out))
    policies.run(begin_save, [(out, i) for i in range(policies.n)])
    finish = _Finish(policies)
    try:
        if getattr(policies, "critic", None) is not None:  # MAAC's central critic
            save_critic(policies.critic, lay.central_critic, lay.central_critic_optimizer)
        lay.write_trainer_state(state)
    except BaseException:
        policies.run(wait_save, [()] * policies.n)  # (the agents' writes end before the caller removes `out`)
        raise
    return finish


class _Finish:
    """`finish()` of `begin_checkpoint`: waits for every agent's write, returns their files' digests; `ended`: when
    the last of them ended (time.time(), for the time a write took beside other work)."""

    def __init__(self, policies):
        self.policies, self.ended = policies, None

    def __call__(self) -> dict[str, str]:
        n = self.policies.n
        self.policies.run(wait_save, [()] * n)  # every write has ended before any error is raised
        digests: dict[str, str] = {}
        for part, ended in self.policies.run(finish_save, [()] * n):
            digests.update(part)
            self.ended = max(self.ended or ended, ended)
        return digests


def save_checkpoint(policies, out: Path, state: dict) -> dict[str, str]:
    """Write a whole checkpoint into `out` (every agent, MAAC's central critic, the trainer state); the agents of a
    group write side by side (in-process: on writer threads; workers: each in its process). Returns the digests of
    the agents' files (for `ArtifactStore.put_dir`)."""
    return begin_checkpoint(policies, out, state)()
