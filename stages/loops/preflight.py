"""Pre-flight: check a run config against the world before anything expensive starts.

Run by `coopflow run` before a Prefect server starts or any model loads, so bad input fails in a second with
one line naming the field or file: the data dir must be a writable directory; every piece of user code the
config names (reward, processor, formatters, transition, evaluation hooks, metrics callback, centralized
adapter) must import; the taskset must be readable (UTF-8 text), non-empty, with its prompt column. The taskset
is built into the store on the way (the run then finds it cached).
"""

import errno
import os
from pathlib import Path

from schemas.config import RunConfig

__all__ = ["PreflightError", "preflight", "check_user_code"]


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
    from stages.common.user_code import load_callable
    from stages.score.rewards import resolve_processor, resolve_reward
    from stages.tasks.transitions import Transition

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
        from stages.tasks.centralized import load_adapter

        try:
            load_adapter(cfg.centralized_adapter, cfg.centralized_adapter_kwargs)
        except (ValueError, TypeError) as err:
            raise PreflightError(f"centralized_adapter: {err}") from None


def preflight(cfg: RunConfig) -> None:
    """Raise PreflightError (one line naming the field or file) when the config cannot run."""
    from artifacts import ArtifactStore
    from stages.tasks.taskset import build_taskset

    d = _data_dir(cfg)
    check_user_code(cfg)
    try:
        build_taskset(cfg.taskset, ArtifactStore(d / "artifacts", cfg.resolved_remote_store(),
                                                  cfg.remote_store_options))
    except (FileNotFoundError, ValueError, KeyError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise PreflightError(f"taskset: {msg}" if not str(msg).startswith("taskset") else str(msg)) from None
