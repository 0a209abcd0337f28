"""Per-agent worker processes (`parallel_training: mp`): agents generate and update concurrently.

Each agent lives in its own persistent process (spawned once per run, reused across segments) on
its own device from `agent_devices`, with `torch` limited to its share of the main process's torch
threads when on CPU. The main process sends every agent the same per-agent op at once (a module-level function such as
`stages.rollout.generate.generate_op`, pickled by reference; see `stages.agents.state`) and collects
the results **in agent order**, so results do not depend on
which worker finishes first. Processes, not threads: the Python parts of generation hold the GIL.

Workers start from a fork server that has imported torch, transformers and the agent code once
(`forkserver` with a preload list): a fresh interpreter per worker would import them again each
time (~5 s per worker on 2 cores). The fork server is a clean process of its own, never the parent,
so no threads or CUDA state of the parent are forked.

Sampling seeds are per (seed, update, agent), so the samples equal the in-process mode's on CPU.

Logging: a worker sends each log record of its `stages.*` loggers (at the main process's level, e.g. the
generation heartbeat) to the main process as a ('log', ...) message on its pipe, between the op's start and
its result; the main process logs it under the same logger name, so it reaches the same handlers (Prefect's
console, the bar-safe handler) as its own lines. Results are collected from whichever worker is ready, so
one agent's lines are not held back while another agent's op runs.
"""

import logging
import multiprocessing as mp
import traceback
from multiprocessing.connection import wait

from coopflow.stages.agents.spec import AgentSpec


class _PipeLogHandler(logging.Handler):
    """In a worker: each record goes to the main process as ('log', (logger name, level, message))."""

    def __init__(self, conn):
        super().__init__()
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            self.conn.send(("log", (record.name, record.levelno, msg)))
        except Exception:
            self.handleError(record)


def _forward_logs(conn, settings: dict) -> None:
    """Route this worker's `stages.*` records to the main process, at its level and heartbeat interval."""
    from coopflow.stages.common import progress

    progress.HEARTBEAT_S = settings.get("heartbeat_s", progress.HEARTBEAT_S)
    root = logging.getLogger()
    root.handlers = [_PipeLogHandler(conn)]
    logging.getLogger("coopflow.stages").setLevel(settings.get("level", logging.WARNING))


def _log_here(msg: tuple) -> bool:
    """Log a worker's ('log', ...) message under its logger here; False for any other message."""
    if msg[0] != "log":
        return False
    name, level, text = msg[1]
    logging.getLogger(name).log(level, "%s", text)
    return True


def _relay(conn):
    """The next non-log message from a worker; log messages on the way are logged here."""
    while _log_here(msg := conn.recv()):
        pass
    return msg


def _worker(conn, spec: AgentSpec, threads: int, log_settings: dict | None = None) -> None:
    """Worker loop: load the agent, then serve ops until 'close'."""
    try:
        _forward_logs(conn, log_settings or {})
        import torch

        from coopflow.stages.common.memory import keep_freed_memory

        if threads > 0:
            torch.set_num_threads(threads)
        keep_freed_memory()
        agent = load_remote_agent(spec)
        conn.send(("ok", None))
    except BaseException as err:  # report load errors to the parent
        conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))
        return
    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            return
        if op == "close":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", op(agent, *args)))
        except BaseException as err:
            conn.send(("error", (type(err).__name__, str(err), traceback.format_exc())))


def load_remote_agent(spec: AgentSpec):
    """The agent a worker process or Ray actor holds: a full model, or (spec.lora) a LoRA adapter on its own
    copy of the base."""
    if spec.lora is not None:
        from coopflow.stages.agents.lora import load_lora_agent

        return load_lora_agent(spec)
    from coopflow.stages.agents.models import load_agent_state

    return load_agent_state(spec)


_REraise = {"FloatingPointError": FloatingPointError, "ValueError": ValueError, "TypeError": TypeError,
            "FileNotFoundError": FileNotFoundError}


def error_class(name: str) -> type:
    """The exception type a remote agent's error is raised as here (its own for bad input, else RuntimeError)."""
    return _REraise.get(name, RuntimeError)


def source_tokenizers(sources: list[str]) -> list:
    """The tokenizers of the agents' sources, for this process (formatters with chat templates need them)."""
    from transformers import AutoTokenizer

    return [AutoTokenizer.from_pretrained(s) for s in sources]


def _raise(agent: int, payload) -> None:
    name, msg, tb = payload
    cls = error_class(name)
    raise cls(f"agent {agent} worker: {name}: {msg}\n--- worker traceback ---\n{tb}")


_PRELOAD = ["torch", "transformers", "coopflow.stages.agents.ops", "coopflow.stages.agents.models"]


def _context():
    """The multiprocessing context for workers: a fork server preloaded with the heavy imports."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class WorkerPolicies:
    """A `PolicyGroup` (see `stages.agents.state`) with one worker process per agent."""

    def __init__(self, specs: list[AgentSpec]):
        cpu_workers = sum(1 for s in specs if s.device == "cpu")
        # the CPU workers share this process's torch thread budget (all cores by default, OMP_NUM_THREADS when set),
        # so an mp run uses as many threads as the in-process run would, split between the agents
        import torch

        threads = max(1, torch.get_num_threads() // max(1, cpu_workers))
        ctx = _context()
        from coopflow.stages.common import progress

        logs = {"level": logging.getLogger("coopflow.stages").getEffectiveLevel(), "heartbeat_s": progress.HEARTBEAT_S}
        self.state: dict = {}
        self.critic = None  # MAAC's central critic lives in the main process
        self._conns, self._procs = [], []
        for i, spec in enumerate(specs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, name=f"coopflow-agent-{i}", daemon=True,
                            args=(child, spec, threads if spec.device == "cpu" else 0, logs))
            p.start()
            child.close()  # only the worker holds its end: a dead worker then reads as EOF, not a hang
            self._conns.append(parent)
            self._procs.append(p)
        # The tokenizers are needed here too (formatters with chat templates): loaded while the workers load their
        # models (in a fresh process the first load imports transformers' tokenizer stack, ~3 s). A source whose
        # tokenizer fails to load here is left to the workers, whose start-up error names what is wrong.
        self._sources = [s.source for s in specs]
        try:
            self._tokenizers = source_tokenizers(self._sources)
        except Exception:
            self._tokenizers = None
        try:
            for i, c in enumerate(self._conns):
                try:
                    status, payload = _relay(c)
                except EOFError:
                    raise RuntimeError(
                        f"agent {i} worker exited during start-up (exit code {self._procs[i].exitcode}). Workers "
                        "are started as fresh processes: a script that trains with parallel_training='mp' must "
                        "guard its entry point with `if __name__ == '__main__':`") from None
                if status == "error":
                    _raise(i, payload)
        except BaseException:
            self.close()
            raise

    @property
    def n(self) -> int:
        return len(self._conns)

    @property
    def tokenizers(self) -> list:
        if self._tokenizers is None:
            self._tokenizers = source_tokenizers(self._sources)
        return self._tokenizers

    def run(self, op, per_agent_args: list[tuple]) -> list:
        """Send the per-agent op `op(agent, *args)` to every worker at once, then collect results in agent order."""
        for i, (c, args) in enumerate(zip(self._conns, per_agent_args)):
            try:
                c.send((op, args))
            except OSError:  # (a broken pipe: the worker is gone)
                raise RuntimeError(f"agent {i} worker: {self._died(i)}") from None
        replies: dict[int, tuple] = {}
        waiting = dict(enumerate(self._conns))
        while waiting:  # whichever worker is ready: its log lines are relayed as they come
            for c in wait(list(waiting.values())):
                i = next(j for j, cj in waiting.items() if cj is c)
                try:
                    msg = c.recv()
                except (EOFError, OSError):  # (a reset connection: the worker is gone)
                    msg = ("died", self._died(i))
                if _log_here(msg):
                    continue
                replies[i] = msg
                del waiting[i]
        for i in sorted(replies):  # the first agent's failure, whichever way its worker noticed it
            status, payload = replies[i]
            if status == "died":  # worded as where sending to a dead worker fails
                raise RuntimeError(f"agent {i} worker: {payload}") from None
            if status == "error":
                _raise(i, payload)
        return [replies[i][1] for i in range(len(self._conns))]

    def _died(self, i: int) -> str:
        """Why worker i is gone, in words."""
        p = self._procs[i]
        p.join(timeout=1)
        code = p.exitcode
        how = (f"killed by signal {-code}" if code is not None and code < 0 else
               f"exit code {code}" if code is not None else "its pipe closed")
        return f"the worker process died ({how})"

    def close(self) -> None:
        """Stop the workers."""
        for c, p in zip(self._conns, self._procs):
            try:
                if p.is_alive():
                    c.send(("close", None))
                    if c.poll(30):
                        _relay(c)
            except (OSError, EOFError):
                pass
            c.close()
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        self._conns, self._procs = [], []


def agent_devices(spec: str | list[str] | None, n: int, default: str) -> list[str]:
    """Resolve agent_devices: None -> default for all; a str or 1-list broadcast; n-list one each."""
    from coopflow.schemas.config import per_agent_values

    return [default] * n if spec is None else per_agent_values(spec, n, "agent_devices")

