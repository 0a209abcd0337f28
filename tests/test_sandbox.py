"""The sandbox on hand-written hostile programs: each is scored or refused as designed, the run unharmed."""

import sys
import time
from pathlib import Path

import pytest

from coopflow.stages.common.sandbox import Isolation, SandboxLimits, run_many, run_python

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_mb=512, file_mb=1, max_output_bytes=1000)
MODES = [pytest.param(Isolation(sys.executable, False), id="process")]
if Isolation.detect().own_uid:  # running as root: the OS-level fences too
    MODES.append(pytest.param(Isolation.detect(), id="os"))

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
