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
