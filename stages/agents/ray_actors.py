"""Agents as Ray actors (`parallel_training: ray`): the `mp` workers' interface, placed by Ray on any node.

Each agent (with its frozen reference model and its own critic, when the run has them) lives in one
Ray actor that reserves the agent's `ray.num_cpus_per_agent` / `ray.num_gpus_per_agent`; Ray places
the actors on whatever nodes of the cluster have those resources. The main process sends every
agent the same per-agent op at once (`op(agent, *args)`, as for `stages.agents.workers`) and
collects the results **in agent order**, so results never depend on which actor finishes first.
An actor's torch threads are its CPU reservation (at least 1), so a run's samples and weights equal
the `mp` mode's for the same seed and thread count.

The cluster: `ray.address` (or $RAY_ADDRESS) joins an existing one; otherwise a local Ray instance
is started for the run (`ray.local_num_cpus`, `ray.object_store_mb`). Model sources and checkpoint
paths are file paths: on a multi-node cluster they must be on storage every node sees (the same
shared data dir the work-pool setup uses), and coopflow must be installed on every node.
"""

from __future__ import annotations

import os
import threading

from coopflow.schemas.config import RayConfig
from coopflow.stages.agents.spec import AgentSpec

_LOCK = threading.Lock()
_STARTED_HERE = False


def ensure_ray(settings: RayConfig | None = None):
    """`ray`, initialised once per process: joined to `settings.address` ($RAY_ADDRESS) or a local instance
    (settings None: RayConfig's defaults)."""
    global _STARTED_HERE
    settings = settings if settings is not None else RayConfig()
    try:
        import ray
    except ImportError:
        raise ImportError("parallel_training / reward.executor 'ray' needs Ray: pip install 'coopflow[ray]'") from None
    with _LOCK:
        if ray.is_initialized():
            return ray
        address = settings.address or os.environ.get("RAY_ADDRESS") or None
        kwargs: dict = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING",
                        "configure_logging": True}
        # (workers import the installed `coopflow` package: install it on every node of a joined cluster)
        if address:
            ray.init(address=address, **kwargs)
        else:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private instance on this machine's loopback
            if settings.local_num_cpus:
                kwargs["num_cpus"] = settings.local_num_cpus
            if settings.object_store_mb:
                kwargs["object_store_memory"] = settings.object_store_mb * 2 ** 20
            ray.init(**kwargs)
            _STARTED_HERE = True
        return ray


def shutdown_ray() -> None:
    """Stop the Ray instance this process started (a joined cluster is only disconnected)."""
    global _STARTED_HERE
    try:
        import ray
    except ImportError:
        return
    with _LOCK:
        if ray.is_initialized():
            ray.shutdown()
        _STARTED_HERE = False


class AgentActor:
    """One agent inside a Ray actor: loads it on construction, then runs per-agent ops on it."""

    def __init__(self, threads: int, spec: AgentSpec):
        import torch

        torch.set_num_threads(max(1, threads))
        from coopflow.stages.agents.workers import load_remote_agent
        from coopflow.stages.common.memory import keep_freed_memory

        keep_freed_memory()

        self.agent = load_remote_agent(spec)

    def ready(self) -> str:
        """The node this actor runs on (start-up errors surface when this is awaited)."""
        import socket

        return socket.gethostname()

    def run(self, op, args: tuple):
        return op(self.agent, *args)


class RayPolicies:
    """A `PolicyGroup` (see `stages.agents.state`) with one Ray actor per agent."""

    def __init__(self, specs: list[AgentSpec], settings):
        ray = ensure_ray(settings)
        n = len(specs)
        cpus = settings.per_agent("num_cpus_per_agent", n)
        gpus = settings.per_agent("num_gpus_per_agent", n)
        remote = ray.remote(AgentActor)
        self.state: dict = {}
        self.critic = None  # MAAC's central critic lives in the main process
        self._sources = [s.source for s in specs]
        self._tokenizers = None
        self._actors = [remote.options(num_cpus=cpus[i], num_gpus=gpus[i], name=None,
                                       max_restarts=0).remote(int(cpus[i]), spec) for i, spec in enumerate(specs)]
        try:
            self.nodes = self._gather([a.ready.remote() for a in self._actors])
        except BaseException:
            self.close()
            raise

    def _gather(self, refs: list) -> list:
        """Results in agent order; the first failing agent's error is raised naming the agent."""
        import ray

        results, error = [], None
        for i, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayTaskError as err:
                results.append(None)
                cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
                error = error or (i, cause)
            except ray.exceptions.RayActorError as err:
                results.append(None)
                error = error or (i, RuntimeError(f"actor died: {err}"))
        if error is not None:
            from coopflow.stages.agents.workers import error_class

            i, cause = error
            raise error_class(type(cause).__name__)(f"agent {i} actor: {type(cause).__name__}: {cause}") from cause
        return results

    @property
    def n(self) -> int:
        return len(self._actors)

    @property
    def tokenizers(self) -> list:
        if self._tokenizers is None:
            from coopflow.stages.agents.workers import source_tokenizers

            self._tokenizers = source_tokenizers(self._sources)
        return self._tokenizers

    def run(self, op, per_agent_args: list[tuple]) -> list:
        """Send the per-agent op `op(agent, *args)` to every actor at once; results in agent order."""
        return self._gather([a.run.remote(op, args) for a, args in zip(self._actors, per_agent_args)])

    def close(self) -> None:
        """Stop the actors (the cluster stays up for the rest of the run)."""
        try:
            import ray
        except ImportError:
            return
        for a in self._actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self._actors = []
