"""Running untrusted Python (model-written programs, their tests) so it can never hang or harm a run.

Each program runs in its own subprocess, in a fresh temp working dir, with:

- a wall-clock timeout, after which its whole process group is killed (SIGKILL);
- resource limits: address space (`memory_mb`), CPU seconds, file size (which also caps stdout/stderr:
  they go to files in the temp dir, and only the first `max_output_bytes` are read back), open files;
- a guard prelude that refuses sockets, subprocesses, forks and writes outside the working dir at the
  Python level (defence in depth, and the only fence where the OS-level ones are unavailable).

When coopflow runs as root (containers, CI) the OS fences it too: the program gets a network namespace
with no interfaces (no network at all), runs as its own unused uid (so the file system refuses writes
outside its dir, and a per-uid process limit stops fork bombs), and after it ends every process of
that uid is killed, including ones that escaped its process group. That needs an interpreter other
users may execute (e.g. /usr/bin/python3); `Isolation.detect()` says what this machine allows, and
`RunResult.isolation` records what a run got.

`run_many` runs programs in parallel on a bounded thread pool (each thread only waits on its
subprocess) and returns the results in input order.
"""

import ctypes
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed program."""

    timeout_s: float = 10.0  # wall clock, then the process group is killed
    cpu_s: int = 10  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE: largest file (and stdout/stderr) the program may write
    max_output_bytes: int = 20_000  # of stdout and of stderr read back
    max_processes: int = 32  # RLIMIT_NPROC (enforced when the program runs as its own uid)
    max_open_files: int = 64


@dataclass(frozen=True)
class RunResult:
    """What a sandboxed program did: status ok | error | timeout (wall clock or CPU seconds ran out) |
    output_limit | killed."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str  # "os" (own uid + no network + limits) or "process" (limits + guard only)
    uid: int | None = None  # the uid it ran as ("os" isolation), every process of which was killed after it

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Isolation:
    """What fences this machine allows: a python for the program, and whether it can run as its own uid."""

    python: str
    own_uid: bool

    @staticmethod
    @lru_cache(maxsize=1)
    def detect() -> "Isolation":
        if os.name != "posix" or os.geteuid() != 0:
            return Isolation(sys.executable, False)
        for cand in [sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"]:
            if cand and _world_executable(Path(cand)):
                return Isolation(str(Path(cand).resolve()), True)
        return Isolation(sys.executable, False)


def _world_executable(path: Path) -> bool:
    """Every directory on the way is traversable and the file executable by any user."""
    try:
        real = path.resolve()
        if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


# The prelude every program runs first. It is not a jail on its own (a determined program can undo
# Python-level patches); with own-uid isolation the OS enforces the same rules.
_GUARD = r'''
def _guard():
    import builtins, os, socket, subprocess

    def deny(*a, **k):
        raise PermissionError("sandbox: not allowed")

    root = os.path.realpath(os.getcwd())
    realpath, fsdecode, sep, builtin_open = os.path.realpath, os.fsdecode, os.sep, builtins.open

    def guarded_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and not isinstance(file, int):
            path = realpath(fsdecode(file))
            if not (path == root or path.startswith(root + sep)):
                raise PermissionError(f"sandbox: writing outside the working directory: {path}")
        return builtin_open(file, mode, *a, **k)

    builtins.open = guarded_open
    socket.socket = socket.create_connection = subprocess.Popen = deny
    for name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execvp", "spawnv", "kill", "killpg",
                 "remove", "unlink", "rmdir", "removedirs", "rename", "replace", "chmod", "chown"):
        if hasattr(os, name):
            setattr(os, name, deny)


_guard()
del _guard
'''
# then the program itself, so its tracebacks name program.py and its own line numbers
_RUN = "\nexec(compile(open('program.py').read(), 'program.py', 'exec'), {'__name__': '__main__'})\n"


def _limits_fn(limits: SandboxLimits, uid: int | None, libc):
    """The pre-exec hook: new session, rlimits, and (as root) no network and its own uid."""
    def apply() -> None:
        os.setsid()
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:
            if libc.unshare(CLONE_NEWNET) != 0:
                os._exit(125)
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return apply


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid` (the sandbox's own uid: nothing else runs as it)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _read(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return ""
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[... output truncated]" if len(data) > limit else "")


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), isolation: Isolation | None = None) -> RunResult:
    """Run `code` (a whole Python program) in the sandbox; never raises for anything the program does."""
    iso = isolation or Isolation.detect()
    uid = random.SystemRandom().randrange(200_000, 2_000_000_000) if iso.own_uid else None
    work = Path(tempfile.mkdtemp(prefix="coopflow-sandbox-"))
    try:
        (work / "program.py").write_text(code)
        (work / "main.py").write_text(_GUARD + _RUN)
        if uid is not None:
            for f in (work, work / "program.py", work / "main.py"):
                os.chown(f, uid, uid)
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "HOME": str(work)}
        libc = ctypes.CDLL(None, use_errno=True) if uid is not None else None
        t0 = time.perf_counter()
        with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
            proc = subprocess.Popen([iso.python, "-I", "-S", "main.py"], cwd=work, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, env=env, close_fds=True,
                                    preexec_fn=_limits_fn(limits, uid, libc))
            status = None
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
                if uid is not None:
                    _kill_uid(uid)
        seconds = time.perf_counter() - t0
        rc = proc.returncode
        if status is None:
            if rc == 0:
                status = "ok"
            elif rc == -signal.SIGXCPU:  # the CPU-seconds limit ran out before the wall clock did
                status = "timeout"
            elif rc == -signal.SIGXFSZ:
                status = "output_limit"
            elif rc is not None and rc < 0:
                status = "killed"  # e.g. SIGKILL from the CPU limit
            else:
                status = "error"
        return RunResult(status, rc, _read(work / ".stdout", limits.max_output_bytes),
                         _read(work / ".stderr", limits.max_output_bytes), seconds,
                         "os" if uid is not None else "process", uid)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_many(codes: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 4) -> list[RunResult]:
    """Run many programs on a bounded pool; results in input order."""
    if not codes:
        return []
    iso = Isolation.detect()
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(codes)))) as pool:
        return list(pool.map(lambda c: run_python(c, limits, iso), codes))
