"""Reward fan-out: score many joint actions at once on an existing engine, results in submission order.

Expensive rewards (a sandboxed test run per joint action, a simulator episode) cost more than the
generation they score. `reward.workers: N` (N > 1) hands the reward calls of one scoring stage to an
executor that runs at most N of them at a time:

- `process` (default): a local pool of N processes (multiprocessing's forkserver pool; the reward
  function travels by reference, so it must be importable: a `module:function` path or a built-in);
- `dask`: a Dask `distributed` cluster (`reward.executor_address: tcp://host:8786`, or a local cluster
  of N single-threaded worker processes started for the run);
- `ray`: Ray tasks (one CPU each, at most N in flight) on the cluster of the `ray` config section.

Every executor's `map(jobs, timeout_s, progress)` calls `progress(n)` as the first n results are in (the
scoring heartbeat) and returns, per call, the value or the exception it raised, in the order the calls were
given, so the scores are the same as serial scoring's whatever order the workers finish in. A call
that exceeds `reward.timeout_s` fails the batch with the reward's name (the pool's processes are
terminated and restarted, a Ray task is cancelled); a hung call never blocks the run.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

Progress = Callable[[int], None] | None
"""Called with the number of results in so far (see `stages.common.progress.Heartbeat.tick`)."""

log = logging.getLogger(__name__)

__all__ = ["CallTimeout", "Failed", "invoke", "make_executor", "serial"]


class CallTimeout(Exception):
    """A call did not return within its timeout (the executor stopped it)."""


class Failed:
    """The exception one call raised (returned in its place, so the caller can name the call)."""

    def __init__(self, error: BaseException):
        self.error = error


def invoke(fn: Callable, args: tuple, kwargs: dict, fallback: tuple | None) -> Any:
    """fn(*args, **kwargs); a TypeError retries fn(*fallback) (the reference's signature fallback)."""
    try:
        return fn(*args, **kwargs)
    except TypeError:
        if fallback is None:
            raise
        return fn(*fallback)


def serial(call_one: Callable, calls: list[tuple]):
    """call_one(*c) for each call in this process, yielding each result or its `Failed`; lazy, so a caller that
    stops at the first failure runs nothing after it."""
    for c in calls:
        try:
            yield call_one(*c)
        except Exception as err:
            yield Failed(err)


def _invoke_job(job: tuple) -> Any:
    return invoke(*job)


class ProcessExecutor:
    """A local pool of `workers` processes (forkserver: nothing of this process's threads is forked)."""

    name = "process"

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = None

    def _ensure(self):
        if self._pool is None:
            import multiprocessing as mp

            self._pool = mp.get_context("forkserver").Pool(self.workers)
        return self._pool

    def map(self, jobs: list[tuple], timeout_s: float | None, progress: Progress = None) -> list:
        pool = self._ensure()
        pending = [pool.apply_async(_invoke_job, (job,)) for job in jobs]  # the pool bounds the concurrency
        out: list = []
        import multiprocessing as mp

        for res in pending:
            try:
                out.append(res.get(timeout_s))
            except mp.TimeoutError:
                self.close()  # the hung call's process must go: terminate the pool, a new one starts next time
                out.append(Failed(CallTimeout(f"did not return within {timeout_s:g} s")))
                return out
            except Exception as err:  # raised by the reward in its worker
                out.append(Failed(err))
            if progress is not None:
                progress(len(out))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


class DaskExecutor:
    """A Dask `distributed` client: on `address`, or on a local cluster of `workers` one-thread processes."""

    name = "dask"

    def __init__(self, workers: int, address: str | None):
        self.workers, self.address = workers, address
        self._client = self._cluster = None

    def _ensure(self):
        if self._client is None:
            try:
                from distributed import Client, LocalCluster
            except ImportError:
                raise ImportError("reward.executor 'dask' needs Dask distributed: pip install 'coopflow[dask]'") \
                    from None
            if self.address:
                self._client = Client(self.address, timeout="60s")
            else:
                self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                             dashboard_address=None, silence_logs=logging.WARNING)
                self._client = Client(self._cluster)
        return self._client

    def map(self, jobs: list[tuple], timeout_s: float | None, progress: Progress = None) -> list:
        from distributed import TimeoutError as DaskTimeout

        client = self._ensure()
        futures = [client.submit(invoke, *job, pure=False) for job in jobs]
        out: list = []
        for i, fut in enumerate(futures):
            try:
                out.append(fut.result(timeout=timeout_s))
            except (DaskTimeout, TimeoutError):
                client.cancel(futures[i:])
                out.append(Failed(CallTimeout(f"did not return within {timeout_s:g} s")))
                return out
            except Exception as err:
                out.append(Failed(err))
            if progress is not None:
                progress(len(out))
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._cluster is not None:
            self._cluster.close()
        self._client = self._cluster = None


class RayExecutor:
    """Ray tasks of one CPU each, at most `workers` in flight, on the cluster `ray_settings` names."""

    name = "ray"

    def __init__(self, workers: int, ray_settings):
        self.workers, self.settings = workers, ray_settings
        self._remote = None

    def map(self, jobs: list[tuple], timeout_s: float | None, progress: Progress = None) -> list:
        from coopflow.stages.agents.ray_actors import ensure_ray

        ray = ensure_ray(self.settings)
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1, max_retries=0)(invoke)
        out: list = []
        refs: list = []
        nxt = 0
        while len(out) < len(jobs):
            while nxt < len(jobs) and len(refs) - len(out) < self.workers:  # a sliding window of `workers`
                refs.append(self._remote.remote(*jobs[nxt]))
                nxt += 1
            ref = refs[len(out)]
            try:
                out.append(ray.get(ref, timeout=timeout_s))
            except ray.exceptions.GetTimeoutError:
                for r in refs[len(out):]:
                    ray.cancel(r, force=True)
                out.append(Failed(CallTimeout(f"did not return within {timeout_s:g} s")))
                return out
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
                out.append(Failed(cause))
            if progress is not None:
                progress(len(out))
        return out

    def close(self) -> None:
        self._remote = None


def make_executor(kind: str, workers: int, address: str | None = None, ray_settings=None):
    """The executor for `reward.executor` with `reward.workers` (None when workers is 1: serial, in process)."""
    if workers <= 1:
        return None
    if kind == "process":
        return ProcessExecutor(workers)
    if kind == "dask":
        return DaskExecutor(workers, address)
    if kind == "ray":
        return RayExecutor(workers, ray_settings)
    raise ValueError(f"reward.executor must be process, dask or ray; got {kind!r}")


def picklable(fn: Callable) -> bool:
    """Whether `fn` can travel to a process pool by reference (lambdas and closures cannot)."""
    try:
        pickle.dumps(fn)
        return True
    except Exception:
        return False
