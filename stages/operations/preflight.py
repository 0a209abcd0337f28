"""Pre-flight: check a run config against the world before anything expensive starts.

Run by `coopflow run` before a Prefect server starts or any model loads, so bad input fails in a second with
one line naming the field or file: the data dir must be a writable directory; every piece of user code the
config names (reward, processor, formatters, transition, evaluation hooks, metrics callback, centralized
adapter) must import; the taskset must be readable (UTF-8 text), non-empty, with its prompt column, and every row
it uses must give each agent a non-empty prompt and carry the fields the reward reads (`check_rows`, naming the
split, row and field). The taskset is built into the store on the way (the run then finds it cached).

It also estimates the disk the run writes (`disk_estimate`: checkpoints from the models' parameter counts, read
from their safetensors headers or the tiny model's shape without loading anything, and the generated rollouts)
and refuses a run that clearly does not fit in the free space under the data dir (`check_disk: false` skips that).
"""

import errno
import json
import math
import os
import shutil
import struct
from pathlib import Path

from coopflow.schemas.config import RunConfig
from coopflow.stages.planning import budget

__all__ = ["PreflightError", "preflight", "check_user_code", "disk_estimate", "model_size"]


class PreflightError(ValueError):
    """A config that cannot run; the message names the field or file."""


def _data_dir(cfg: RunConfig) -> Path:
    """The data dir, created if needed, and checked writable."""
    d = cfg.resolved_data_dir()
    for parent in [d, *d.parents]:
        if parent.exists() and not parent.is_dir():
            raise PreflightError(f"data_dir {d}: {parent} is a file, not a directory")
    try:
        (d / "artifacts").mkdir(parents=True, exist_ok=True)
        probe = d / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        why = "not writable" if err.errno in (errno.EACCES, errno.EROFS, errno.EPERM) else err.strerror
        raise PreflightError(f"data_dir {d}: {why} ({err.__class__.__name__}); set data_dir or COOPFLOW_HOME to a "
                             "writable directory") from None
    return d


def check_user_code(cfg: RunConfig) -> None:
    """Every import path the config names must load (PreflightError naming the field otherwise)."""
    try:
        _user_code(cfg)
    except (ValueError, TypeError, ImportError) as err:
        raise PreflightError(str(err)) from None


def _user_code(cfg: RunConfig) -> None:
    from coopflow.stages.common.user_code import load_callable
    from coopflow.stages.score.rewards import resolve_processor, resolve_reward
    from coopflow.stages.tasks.transitions import Transition

    resolve_reward(cfg.reward.name, cfg.reward.kwargs)
    resolve_processor(cfg.reward.processor)
    wants_ray = cfg.trainer.parallel_training == "ray" or (cfg.reward.workers > 1 and cfg.reward.executor == "ray")
    for needed, module, extra, field in (
            (cfg.agents.lora is not None, "peft", "lora", "agents.lora"),
            (wants_ray, "ray", "ray", "trainer.parallel_training / reward.executor ray"),
            (cfg.reward.workers > 1 and cfg.reward.executor == "dask", "distributed", "dask", "reward.executor dask")):
        if needed:
            import importlib.util

            if importlib.util.find_spec(module) is None:
                raise ImportError(f"{field} needs the {module!r} package: pip install 'coopflow[{extra}]'")
    fmts = cfg.formatters if isinstance(cfg.formatters, list) else [cfg.formatters] if cfg.formatters else []
    for i, f in enumerate(fmts):
        if f.function:
            load_callable(f.function, f"formatters[{i}].function")
    if cfg.transition is not None:  # (checked even for one turn: a wrong path is a mistake either way)
        Transition(cfg.transition.name, cfg.transition.kwargs)
    for field in ("eval_logger", "eval_aggregator", "metrics_callback"):
        if getattr(cfg, field):
            load_callable(getattr(cfg, field), field)
    if cfg.centralized_adapter is not None:
        from coopflow.stages.tasks.centralized import load_adapter

        try:
            load_adapter(cfg.centralized_adapter, cfg.centralized_adapter_kwargs)
        except (ValueError, TypeError) as err:
            raise PreflightError(f"centralized_adapter: {err}") from None


def preflight(cfg: RunConfig) -> "budget.DiskEstimate | None":
    """Raise PreflightError (one line naming the field or file) when the config cannot run; returns the disk
    estimate (None when a model's size is unknown)."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.tasks.taskset import build_taskset, load_items

    d = _data_dir(cfg)
    check_user_code(cfg)
    if cfg.sandbox.require_isolation:
        from coopflow.stages.common.sandbox import Isolation

        if Isolation.detect().level == "process":
            raise PreflightError("sandbox.require_isolation: this machine allows no OS-level isolation of "
                                 "model-written programs (not root, and `unshare` with unprivileged user namespaces "
                                 "or Landlock is unavailable); run as root, enable them, or set it to false")
    store = ArtifactStore.at(d, cfg)
    try:
        ref = build_taskset(cfg.taskset, store)
    except (FileNotFoundError, ValueError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise PreflightError(f"taskset: {msg}" if not str(msg).startswith("taskset") else str(msg)) from None
    train = load_items(store, ref, "train")
    check_rows(cfg, {"train": train, "eval": load_items(store, ref, "eval")})
    est = disk_estimate(cfg, train)
    if est is not None and cfg.check_disk:
        check_disk(est, d)
    return est


# --- taskset rows ----------------------------------------------------------------------------------


def check_rows(cfg: RunConfig, splits: dict[str, list[dict]]) -> None:
    """Every row the run will use, checked without a model: each role's prompt text (the formatter without the
    chat template) is a non-empty string, and the row has every field the reward reads (`required_fields` of
    the reward function, e.g. HumanEval's test and entry_point). PreflightError names the taskset, split, row
    and field."""
    from coopflow.stages.score.rewards import resolve_reward, reward_attribute
    from coopflow.stages.tasks.formatters import role_formatter

    needs = tuple(reward_attribute(resolve_reward(cfg.reward.name, cfg.reward.kwargs), "required_fields", ()))
    column = f"the prompt column {cfg.taskset.prompt_column!r}"
    formats = [(i, role_formatter(f), f.function or f.template or column)
               for i, f in ((i, cfg.formatter_for(i)) for i in range(cfg.agents.n))]
    for split, items in splits.items():
        for item in items:
            where = f"taskset {cfg.taskset.name!r} {split} row {item['_item_id']}"
            missing = [f for f in needs if item.get(f) is None]
            if missing:
                raise PreflightError(f"{where}: no {', '.join(map(repr, missing))} field, which reward "
                                     f"{cfg.reward.name!r} reads (fields: {sorted(k for k in item if k[0] != '_')})")
            for agent, fmt, source in formats:
                try:
                    text = fmt(item)
                except (KeyError, ValueError, TypeError, IndexError) as err:
                    raise PreflightError(f"{where}: agent {agent}'s prompt ({source}) failed: "
                                         f"{err.__class__.__name__}: {err}") from None
                if not isinstance(text, str):
                    raise PreflightError(f"{where}: agent {agent}'s prompt ({source}) is a {type(text).__name__}, "
                                         "not text")
                if not text.strip():
                    raise PreflightError(f"{where}: agent {agent}'s prompt is empty ({source}): every agent needs "
                                         "text to answer")


# --- disk ------------------------------------------------------------------------------------------

_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack")


def _safetensors_params(f: Path) -> tuple[int, int]:
    """(parameters, bytes of their data) from a safetensors file's header (the tensors are not read)."""
    with open(f, "rb") as h:
        (n,) = struct.unpack("<Q", h.read(8))
        header = json.loads(h.read(n))
    params = nbytes = 0
    for name, t in header.items():
        if name != "__metadata__":
            count = math.prod(t["shape"])
            params += count
            nbytes += count * _DTYPE_BYTES.get(t["dtype"], 4)
    return params, nbytes


def _tiny_params(hidden: int, layers: int, vocab: int = 384) -> int:
    """Parameters of the built-in tiny Qwen2 (`stages.agents.models.build_tiny_model`): tied embeddings, q/k/v
    biases, an MLP of 2 x hidden, half as many key/value heads as heads (hidden // 16)."""
    heads = max(1, hidden // 16)
    kv = max(1, heads // 2) * (hidden // heads)
    per_layer = (hidden * hidden + hidden) + 2 * (hidden * kv + kv) + hidden * hidden + 3 * hidden * 2 * hidden \
        + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden


def _local_dir(src: str) -> Path | None:
    """A model source's files on this machine: its directory, or the Hugging Face cache's snapshot of a hub id."""
    p = Path(src).expanduser()
    if p.is_dir():
        return p
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(src, "config.json")
        return Path(hit).parent if isinstance(hit, str) else None
    except Exception:  # not an id, or no hub client: size unknown
        return None


def model_size(src: str, cfg: RunConfig) -> tuple[int, int, int] | None:
    """(parameters, bytes per stored parameter, bytes of the other files) of a model source, read without loading
    it; None when its files are not on this machine (a hub id not yet downloaded, a catalog model not installed)."""
    if src == "tiny":
        return _tiny_params(cfg.agents.tiny_hidden_size, cfg.agents.tiny_num_layers), 4, 15_000
    d = _local_dir(src)
    if d is None:
        return None
    files = [f for f in d.rglob("*") if f.is_file()]
    params = nbytes = 0
    for f in files:
        if f.suffix == ".safetensors":
            p, b = _safetensors_params(f)
            params, nbytes = params + p, nbytes + b
    if params == 0:  # pickled weights only: assume float32
        nbytes = sum(f.stat().st_size for f in files if f.suffix in _WEIGHT_SUFFIXES)
        params = nbytes // 4
    other = sum(f.stat().st_size for f in files if f.suffix not in _WEIGHT_SUFFIXES and not f.name.startswith("."))
    return (params, round(nbytes / params) if params else 4, other) if params else None


def _dtype_bytes(dtype: str, stored: int) -> int:
    """Bytes per parameter of the weights a run saves: agents.dtype, or the source's own for 'auto'."""
    return {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(str(dtype), stored)


def disk_estimate(cfg: RunConfig, train_items: list) -> "budget.DiskEstimate | None":
    """What the run will write into the store (see `budget.estimate_disk`); None when a model's size is unknown."""
    from coopflow.stages.planning.plan import is_actor_critic, plan_segments, plan_updates, trains_in_segments

    t, a = cfg.trainer, cfg.agents
    sizes = [model_size(s, cfg) for s in cfg.actor_sources()]
    critics = cfg.critic_sources() if is_actor_critic(cfg) and hasattr(cfg, "critic_sources") else []
    csizes = [model_size(s, cfg) for s in critics or []]
    if any(x is None for x in sizes + csizes):
        return None
    wb = _dtype_bytes(a.dtype, sizes[0][1])
    params = sum(p for p, _, _ in sizes + csizes)
    other = sum(o for _, _, o in sizes + csizes)
    trained = params
    if a.lora is not None:  # adapters only: r x (in + out) per target module and layer, about r x 2 x hidden
        per_agent = _lora_params(cfg, a.lora)
        params = trained = per_agent * len(sizes)
        wb = 4
    n, k = len(sizes), t.num_generations
    _, nodes = budget.tree_size(k, n, t.num_turns, t.joint_mode, t.tree_expansion)
    if trains_in_segments(cfg):
        units = nodes * (k if is_actor_critic(cfg) else 1)
        updates = plan_updates(len(train_items), t.num_train_epochs, t.rollout_buffer_size, 1, units)
        checkpoints = len(plan_segments(updates, cfg.checkpoint_every))
        sequences = len(train_items) * t.num_train_epochs * nodes * k * n
    else:  # preference flows: one checkpoint (per round), P candidates per item and agent (per round)
        rounds = t.num_rounds
        checkpoints = rounds
        sequences = rounds * len(train_items) * n * t.preference_num_candidates
    prompt = sum(len(str(it.get("prompt", ""))) for it in train_items) / max(1, len(train_items))
    per_seq = int(2 * prompt + 8 * t.max_new_tokens + 200)  # text + token ids of prompt and completion, row overhead
    return budget.estimate_disk(params, trained, wb, other, checkpoints, cfg.checkpoint_optimizer, sequences, per_seq)


def _lora_params(cfg: RunConfig, lora) -> int:
    """Trainable parameters of one agent's LoRA adapter (from the base model's config.json)."""
    src = cfg.actor_sources()[0]
    if src == "tiny":
        hidden, layers = cfg.agents.tiny_hidden_size, cfg.agents.tiny_num_layers
    else:
        d = _local_dir(src)
        conf = json.loads((d / "config.json").read_text()) if d and (d / "config.json").is_file() else {}
        hidden, layers = conf.get("hidden_size", 1024), conf.get("num_hidden_layers", 24)
    return lora.r * 2 * hidden * len(lora.target_modules) * layers


def check_disk(est: "budget.DiskEstimate", data_dir: Path) -> None:
    """PreflightError when the run's estimated writes exceed the free space under the data dir."""
    free = shutil.disk_usage(data_dir).free
    if est.total_bytes <= free:
        return
    raise PreflightError(
        f"data_dir {data_dir}: this run writes {est.describe()}, but only {budget.human_bytes(free)} is free there. Free "
        "space (`coopflow gc` lists what no recorded run needs), point data_dir / COOPFLOW_HOME at a larger disk, "
        "write fewer checkpoints (checkpoint_every), keep less optimizer state (checkpoint_optimizer: last or "
        "none), or set check_disk: false if it is already stored")
