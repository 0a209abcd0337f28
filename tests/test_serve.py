"""Deployment objects built by `coopflow serve`: names, schedules, default parameters."""

from datetime import timedelta


def test_deployments_names_schedules_and_defaults():
    from coopflow.flows.serve import deployments

    deps = deployments("nightly", cron="0 3 * * *", config_path="/abs/configs/magrpo-story.yaml")
    assert sorted(d.name for d in deps) == ["nightly"] * 11
    assert {d.flow_name for d in deps} == {"train-magrpo", "train-magrpo-centralized", "train-mareinforce", "train-marloo", "train-maremax",
                                                 "train-iac", "train-maac", "train-madpo", "train-marlhf",
                                                 "train-madpo-iter", "train-marlhf-iter"}
    for d in deps:
        extra = {"max_new_rounds": 1} if d.flow_name.endswith("-iter") else {}  # one round per scheduled run
        assert d.parameters == {"config_path": "/abs/configs/magrpo-story.yaml", **extra}
        assert [s.schedule.cron for s in d.schedules] == ["0 3 * * *"]
    every = deployments("local", interval=3600)
    assert all(s.schedule.interval == timedelta(hours=1) for d in every for s in d.schedules)
    assert all(not d.schedules for d in deployments("local"))


def test_the_cli_knows_every_flow():
    from coopflow.flows.cli import FLOW_NAMES, ITERATIVE
    from coopflow.flows.train import FLOWS

    assert FLOW_NAMES == tuple(FLOWS) and set(ITERATIVE) == {f for f in FLOWS if f.endswith("-iter")}


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Accept": "text/html"})  # as a browser navigates (the UI's deep
    try:                                                                  # links answer HTML navigations only)
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, ""
    except OSError:  # not listening yet
        return 0, ""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


import pytest  # noqa: E402


@pytest.mark.slow
def test_coopflow_serve_starts_the_prefect_ui(tmp_path):
    """`coopflow serve` on a machine with no server: the UI pages answer (they were 404 with --no-ui)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI",
                                                            "PREFECT_SERVER_UI_ENABLED")}
    env.update(COOPFLOW_HOME=str(tmp_path / "home"))
    out = open(tmp_path / "serve.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "serve", "--port", str(port)], env=env, stdout=out,
                         stderr=out, cwd=Path(__file__).resolve().parents[1], start_new_session=True)
    try:
        t0 = time.time()
        while _get(f"http://127.0.0.1:{port}/api/health")[0] != 200:
            assert time.time() - t0 < 240 and p.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        for page in ("/", "/runs", "/deployments"):
            status, body = _get(f"http://127.0.0.1:{port}{page}")
            assert status == 200 and "<html" in body.lower(), (page, status)
        while f"Prefect UI: http://127.0.0.1:{port}" not in (tmp_path / "serve.log").read_text():
            assert time.time() - t0 < 240, (tmp_path / "serve.log").read_text()[-3000:]  # said once it is up
            time.sleep(0.5)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
        out.close()
        for proc in Path("/proc").iterdir():  # the server `serve` started runs in its own session: stop it too
            try:
                if proc.name.isdigit() and f"--port\0{port}".encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGTERM)
            except OSError:
                pass


def _serve(home, port: int, log, *extra):
    """`coopflow serve --no-ui` for data dir `home` (its own process group, as a shell job)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI",
                                                            "PREFECT_SERVER_UI_ENABLED")}
    env.update(COOPFLOW_HOME=str(home))
    return subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "serve", "--no-ui", "--port", str(port),
                             *extra], env=env, stdout=log, stderr=log, cwd=Path(__file__).resolve().parents[1],
                            start_new_session=True)


def _wait_for_record(home, proc, log_path, timeout: float = 240) -> dict:
    """The server record `serve` writes under the data dir, once that server answers."""
    import json
    import time

    rec_file = home / "prefect" / "server.json"
    t0 = time.time()
    while True:
        assert time.time() - t0 < timeout and proc.poll() is None, log_path.read_text()[-3000:]
        if rec_file.is_file():
            rec = json.loads(rec_file.read_text())
            if _get(rec["url"] + "/health")[0] == 200 and "serving deployments" in log_path.read_text():
                return rec
        time.sleep(0.5)


def _gone(pid: int, timeout: float = 30) -> bool:
    import os
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.3)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_the_server_serve_starts_stops_with_it(tmp_path, sig):
    """Ctrl-C (SIGINT), SIGTERM or kill -9 of `coopflow serve`: the Prefect server it started stops too (it used to
    keep running on 127.0.0.1:4200 with its SQLite DB, unsaid)."""
    import signal

    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        p = _serve(tmp_path / "home", port, log)
        try:
            rec = _wait_for_record(tmp_path / "home", p, log_path)
            p.send_signal(getattr(signal, sig))
            p.wait(timeout=180)  # Prefect's runner, if already up, pauses its deployments first (slow on a busy machine)
            assert _gone(rec["pid"]), f"the server (pid {rec['pid']}) outlived `coopflow serve` ({sig})"
            assert _get(f"http://127.0.0.1:{port}/api/health")[0] == 0
            if sig != "SIGKILL":
                assert p.returncode == 130 and not (tmp_path / "home" / "prefect" / "server.json").exists()
                assert "coopflow serve: stopped" in log_path.read_text()
        finally:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_serve_ends_within_its_grace_when_the_runner_swallows_the_interrupt(tmp_path):
    """Prefect's runner can swallow a Ctrl-C during its start-up or shutdown (CI saw `serve` keep running for 180 s):
    past SERVE_STOP_GRACE_S, serve stops its server and exits 130 anyway."""
    import os
    import signal
    import subprocess
    import sys
    import time

    port = _free_port()
    log_path = tmp_path / "serve.log"
    code = ("import sys, time\n"
            "import coopflow.flows.cli as C, coopflow.flows.serve as S\n"
            "C.SERVE_STOP_GRACE_S = 3.0\n"
            "def stubborn(*a, **k):\n"
            "    print('serving deployments', file=sys.stderr, flush=True)\n"
            "    while True:\n"
            "        try:\n"
            "            time.sleep(0.2)\n"
            "        except KeyboardInterrupt:\n"
            "            pass\n"
            "S.serve_all = stubborn\n"
            f"sys.exit(C.main(['serve', '--no-ui', '--port', '{port}']))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI")}
    env.update(COOPFLOW_HOME=str(tmp_path / "home"))
    with open(log_path, "w") as log:
        p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=log, stderr=log, start_new_session=True)
        try:
            rec = _wait_for_record(tmp_path / "home", p, log_path)
            t0 = time.time()
            p.send_signal(signal.SIGINT)
            assert p.wait(timeout=60) == 130 and time.time() - t0 < 40
            assert _gone(rec["pid"]), "the server outlived `coopflow serve`"
            assert "did not shut down within 3 s" in log_path.read_text()
        finally:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_two_data_dirs_never_share_a_prefect_server(tmp_path):
    """A `coopflow serve` of data dir B finds data dir A's server on its port: it says so and starts B's own on a
    free port (it used to attach to A's, recording B's deployments and runs in A's Prefect DB); --keep-server
    leaves A's up and the next `coopflow serve` of A reuses it."""
    import os
    import signal

    port = _free_port()
    logs = [tmp_path / "a.log", tmp_path / "b.log", tmp_path / "a2.log"]
    files = [open(p, "w") for p in logs]
    procs = []
    try:
        a = _serve(tmp_path / "a", port, files[0], "--keep-server")
        procs.append(a)
        rec_a = _wait_for_record(tmp_path / "a", a, logs[0])
        b = _serve(tmp_path / "b", port, files[1])
        procs.append(b)
        rec_b = _wait_for_record(tmp_path / "b", b, logs[1])
        assert rec_b["url"] != rec_a["url"] and rec_b["pid"] != rec_a["pid"]
        assert f"127.0.0.1:{port} is in use by a server that is not this data dir's" in logs[1].read_text()
        for p in (a, b):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
        assert _gone(rec_b["pid"]) and not _gone(rec_a["pid"], timeout=3)  # A's was kept, as asked
        assert "--keep-server" in logs[0].read_text() and f"kill -TERM -{rec_a['pid']}" in logs[0].read_text()
        a2 = _serve(tmp_path / "a", port, files[2])
        procs.append(a2)
        assert _wait_for_record(tmp_path / "a", a2, logs[2])["pid"] == rec_a["pid"]  # A's own server, reused
        assert "using this data dir's Prefect server" in logs[2].read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        try:
            os.killpg(rec_a["pid"], signal.SIGTERM)
        except (NameError, ProcessLookupError):
            pass
        for f in files:
            f.close()
