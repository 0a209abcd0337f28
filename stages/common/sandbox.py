"""Running untrusted Python (model-written programs, their tests) so it can never hang or harm a run.

Each program runs in its own subprocess, in a fresh temp working dir, with:

- a wall-clock timeout, after which its whole process group is killed (SIGKILL);
- resource limits: address space (`memory_mb`), CPU seconds, file size (which also caps stdout/stderr:
  they go to files in the temp dir, and only the first `max_output_bytes` are read back), open files;
- a guard prelude that refuses sockets, subprocesses, forks and writes outside the working dir at the
  Python level (defence in depth, and the only fence where the OS-level ones are unavailable).

As a normal user, where `unshare` can create unprivileged user namespaces and the kernel has Landlock (Linux
>= 5.13), the program runs in its own user, network and PID namespaces (no network at all, not even this
machine's loopback; when it ends, or its run is killed, every process it started dies with its PID 1) and under
a Landlock ruleset its first lines apply and it cannot lift: it writes only in its working dir and reads only the
system's and Python's files and that dir (not $HOME, not another run's dir). RLIMIT_NPROC then caps its
processes on top of the user's own.

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
    isolation: str  # "os" (root: own uid, no network), "namespaces" (no network, PID ns, Landlock), "process"
    uid: int | None = None  # the uid it ran as ("os" isolation), every process of which was killed after it

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Isolation:
    """What fences this machine allows: a python for the program, whether it can run as its own uid (root), and
    whether it can run in unprivileged namespaces with Landlock (`unshare`: no network, its own PID namespace;
    Landlock: writes only in its working dir, reads only of the system's and Python's files)."""

    python: str
    own_uid: bool
    namespaces: bool = False

    @property
    def level(self) -> str:
        """"os" (root: own uid, no network), "namespaces" (unprivileged: no network, own PID namespace, Landlock)
        or "process" (limits and the Python-level guard only)."""
        return "os" if self.own_uid else "namespaces" if self.namespaces else "process"

    @staticmethod
    @lru_cache(maxsize=1)
    def detect() -> "Isolation":
        """The strongest isolation this machine allows (said once, loudly, when it is only the Python guard)."""
        iso = Isolation._strongest()
        if iso.level == "process":
            import logging

            logging.getLogger(__name__).warning(
                "sandbox: this machine allows no OS-level isolation (not root; `unshare` with unprivileged user "
                "namespaces or Landlock unavailable): model-written programs run with resource limits and a "
                "Python-level guard only, which a determined program can undo")
        return iso

    @staticmethod
    def _strongest() -> "Isolation":
        if os.name != "posix":
            return Isolation(sys.executable, False)
        if os.geteuid() != 0:
            return Isolation(sys.executable, False, _namespaces_work())
        for cand in [sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"]:
            if cand and _world_executable(Path(cand)):
                return Isolation(str(Path(cand).resolve()), True)
        return Isolation(sys.executable, False, _namespaces_work())


@lru_cache(maxsize=1)
def _unshare() -> tuple[str, ...]:
    """The command prefix that runs a program in its own user, network and PID namespaces (empty: no `unshare`)."""
    path = shutil.which("unshare")
    return (path, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child") if path else ()


def _namespaces_work() -> bool:
    """Whether `unshare` can give an unprivileged program its own user, network and PID namespaces here, and the
    kernel has Landlock (both checked by running them once)."""
    if not _unshare():
        return False
    probe = _LANDLOCK + "\n_landlock('.')\nprint('ok')\n"
    try:
        r = subprocess.run([*_unshare(), sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                           text=True, timeout=30, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.strip() == "ok"


def _world_executable(path: Path) -> bool:
    """Every directory on the way is traversable and the file executable by any user."""
    try:
        real = path.resolve()
        if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


# Landlock (Linux >= 5.13), applied by the program's first lines and irrevocable: it may write, create and delete
# only under its working dir (and write /dev/null), read and execute only the system's and Python's own files and
# its working dir (not another run's dir, not $HOME). A program cannot lift it: no ctypes call undoes a ruleset.
_LANDLOCK = r'''
def _landlock(work):
    import ctypes, os, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, 0, 1)
    if abi < 1:
        raise SystemExit("sandbox: Landlock is not available")
    every = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF}.get(abi, 0xFFFF)
    read = 0x1 | 0x4 | 0x8  # execute, read file, read dir
    fd = libc.syscall(444, struct.pack("Q", every), 8, 0)
    if fd < 0:
        raise SystemExit("sandbox: cannot create a Landlock ruleset")
    def allow(path, access):
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if libc.syscall(445, fd, 1, struct.pack("=Qi", access & every, pfd), 0) != 0:
                raise SystemExit(f"sandbox: Landlock rule for {path} refused")
        finally:
            os.close(pfd)
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/dev", sys.prefix,
                 sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        allow(path, read)
    allow("/dev/null", 0x4 | 0x2 | 0x4000)  # read, write, truncate (a file takes no directory rights)
    allow(work, every)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, fd, 0) != 0:
        raise SystemExit("sandbox: Landlock restriction refused")
    os.close(fd)
    import signal  # CPU seconds ran out: say so by the exit code (unshare reports a death by signal as status 1)
    signal.signal(signal.SIGXCPU, lambda *_: os._exit(128 + signal.SIGXCPU))
'''

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


def _limits_fn(limits: SandboxLimits, uid: int | None, libc, nproc_base: int | None = None):
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
        elif nproc_base is not None:  # unprivileged: the limit counts every process of this user, so on top of them
            n = nproc_base + limits.max_processes
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    return apply


def _processes_of_this_user() -> int:
    """How many processes this user runs now (RLIMIT_NPROC counts them all)."""
    me, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                n += os.stat(f"/proc/{d}").st_uid == me
            except OSError:
                continue
    return n


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
    ns = iso.level == "namespaces"
    work = Path(tempfile.mkdtemp(prefix="coopflow-sandbox-"))
    try:
        (work / "program.py").write_text(code)
        fence = _LANDLOCK + "\n_landlock(__import__('os').getcwd())\ndel _landlock\n" if ns else ""
        (work / "main.py").write_text(fence + _GUARD + _RUN)
        if uid is not None:
            for f in (work, work / "program.py", work / "main.py"):
                os.chown(f, uid, uid)
        env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8", "HOME": str(work)}
        libc = ctypes.CDLL(None, use_errno=True) if uid is not None else None
        t0 = time.perf_counter()
        with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
            command = [iso.python, "-I", "-S", "main.py"]
            if ns:  # its own user, network and PID namespaces: no network, and nothing outlives its PID 1
                command = [*_unshare(), *command]
            proc = subprocess.Popen(command, cwd=work, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    close_fds=True, preexec_fn=_limits_fn(limits, uid, libc,
                                                                          _processes_of_this_user() if ns else None))
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
            elif rc == -signal.SIGXCPU or (ns and rc == 128 + signal.SIGXCPU):  # CPU seconds ran out first
                status = "timeout"
            elif rc == -signal.SIGXFSZ:
                status = "output_limit"
            elif rc is not None and rc < 0:
                status = "killed"  # e.g. SIGKILL from the CPU limit
            else:
                status = "error"
        return RunResult(status, rc, _read(work / ".stdout", limits.max_output_bytes),
                         _read(work / ".stderr", limits.max_output_bytes), seconds, iso.level, uid)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_many(codes: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 4) -> list[RunResult]:
    """Run many programs on a bounded pool; results in input order."""
    if not codes:
        return []
    iso = Isolation.detect()
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(codes)))) as pool:
        return list(pool.map(lambda c: run_python(c, limits, iso), codes))
