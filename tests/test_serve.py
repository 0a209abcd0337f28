"""Deployment objects built by `coopflow serve`: names, schedules, default parameters."""

from datetime import timedelta


REPO_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs"


def test_no_config_serves_every_flow_unscheduled_and_a_schedule_needs_a_config():
    import pytest

    from coopflow.flows.serve import deployments, plan
    from coopflow.flows.train import FLOWS
    from coopflow.schemas.config import ConfigError

    served = plan(None, "local")
    assert [s.full_name for s in served] == [f"{f}/local" for f in FLOWS]
    for d in deployments(served):
        extra = {"max_new_rounds": 1} if d.flow_name.endswith("-iter") else {}  # one round per run
        assert d.parameters == extra and not d.schedules
    for kw in ({"cron": "0 3 * * *"}, {"interval": 60.0}):  # a schedule would run every flow's defaults each tick
        with pytest.raises(ConfigError, match="a schedule needs the config it runs"):
            plan(None, "local", **kw)


def test_a_config_names_its_deployment_flow_and_schedule():
    from coopflow.flows.serve import deployments, plan

    served = plan([str(REPO_CONFIGS / "madpo-iter-story.yaml"), str(REPO_CONFIGS / "magrpo-story.yaml"),
                   str(REPO_CONFIGS / "magrpo-centralized-tldr.yaml")], preflight=False)
    assert [s.full_name for s in served] == ["train-madpo-iter/story", "train-magrpo/story",
                                             "train-magrpo-centralized/tldr"]
    assert served[0].parameters == {"config_path": str(REPO_CONFIGS / "madpo-iter-story.yaml"), "max_new_rounds": 1}
    assert served[1].parameters == {"config_path": str(REPO_CONFIGS / "magrpo-story.yaml")}
    deps = deployments(served, cron="0 3 * * *")
    assert [(d.flow_name, d.name) for d in deps] == [tuple(s.full_name.split("/")) for s in served]
    assert all([s.schedule.cron for s in d.schedules] == ["0 3 * * *"] for d in deps)
    every = deployments(served[:1], interval=3600)
    assert [s.schedule.interval for s in every[0].schedules] == [timedelta(hours=1)]


def test_every_shipped_config_names_the_flow_it_is_for():
    from coopflow.flows.serve import flow_of, from_config
    from coopflow.schemas.config.loading import read_config_file

    flows = {"iac-story": "train-iac", "maac-story": "train-maac", "madpo-story": "train-madpo",
             "marlhf-story": "train-marlhf", "madpo-iter-story": "train-madpo-iter",
             "marlhf-iter-story": "train-marlhf-iter", "magrpo-centralized-tldr": "train-magrpo-centralized"}
    shipped = sorted(REPO_CONFIGS.glob("*.yaml"))
    assert len(shipped) >= 17
    for p in shipped:
        want = flows.get(p.stem, "train-magrpo")  # the rest: the MAGRPO family's default flow
        assert flow_of(read_config_file(p)) == want, p.name
        assert from_config(p, preflight=False).flow == want  # and it loads as that flow loads it


def test_a_config_its_flow_refuses_is_refused_in_one_line(tmp_path):
    import pytest

    from coopflow.flows.serve import plan
    from coopflow.schemas.config import ConfigError

    bad = tmp_path / "magrpo-dpo.yaml"
    bad.write_text("trainer:\n  dpo_beta: 0.1\n")  # a MADPO key; no algorithm: so the flow is train-magrpo
    with pytest.raises(ConfigError) as err:
        plan([str(bad)], cron="0 3 * * *", preflight=False)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("magrpo-dpo.yaml (train-magrpo): ") and "dpo_beta" in msg
    assert "names no `algorithm:`" in msg
    other = tmp_path / "x.yaml"
    other.write_text("algorithm: magrpo-turbo\n")
    with pytest.raises(ConfigError, match="'magrpo-turbo' is no flow"):
        plan([str(other)])
    a, b = tmp_path / "a", tmp_path / "b"  # two files that would be the same deployment
    for d in (a, b):
        d.mkdir()
        (d / "magrpo-story.yaml").write_text((REPO_CONFIGS / "magrpo-story.yaml").read_text())
    with pytest.raises(ConfigError, match="would both be deployment train-magrpo/story"):
        plan([str(a / "magrpo-story.yaml"), str(b / "magrpo-story.yaml")], preflight=False)


def test_serve_refuses_before_starting_anything(tmp_path):
    """`coopflow serve` with a schedule and no config, a bad cron string, or a config its flow refuses: exit 2 and
    one line, in seconds, before any Prefect server starts."""
    import os
    import subprocess
    import sys
    import time

    bad = tmp_path / "magrpo-dpo.yaml"
    bad.write_text("trainer:\n  dpo_beta: 0.1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    env["COOPFLOW_HOME"] = str(tmp_path / "home")
    for extra, says in ((["--cron", "0 3 * * *"], "a schedule needs the config it runs"),
                        ([str(REPO_CONFIGS / "magrpo-story.yaml"), "--cron", "every night"], "is not a cron string"),
                        ([str(bad), "--interval", "60"], "dpo_beta"),
                        ([str(REPO_CONFIGS / "magrpo-story.yaml"), "--cron", "0 3 * * *", "--interval", "60"],
                         "not both")):
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "serve", "--no-ui", "--port", "1", *extra],
                           env=env, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("coopflow serve: "), r.stderr
        assert says in lines[0] and time.time() - t0 < 60
    assert not (tmp_path / "home" / "prefect" / "server.json").exists()



def test_ctrl_c_while_the_server_starts_leaves_no_server_and_no_record(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) while `ensure_server` waits for the Prefect server it started to answer: that server is
    stopped and its record removed before the interrupt goes on (they used to outlive the interrupt, the record
    naming a dead server)."""
    import os
    import subprocess

    from coopflow.flows import cli

    started, popen = [], subprocess.Popen

    def fake_server(args, **kw):  # a process group that never answers /health
        started.append(popen(["sleep", "600"], start_new_session=True))
        return started[-1]

    def interrupted(url):
        assert (tmp_path / "prefect" / cli.SERVER_RECORD).is_file()  # recorded before the wait
        raise KeyboardInterrupt

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setattr(cli.subprocess, "Popen", fake_server)
    monkeypatch.setattr(cli, "healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.ensure_server(_free_port(), ui=False, keep=True)
    assert started and started[0].wait(timeout=30) is not None
    assert not (tmp_path / "prefect" / cli.SERVER_RECORD).exists()
    assert "PREFECT_API_URL" not in os.environ

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


@pytest.mark.slow
def test_two_served_configs_run_on_their_schedule_and_nothing_else_runs(tmp_path):
    """`coopflow serve A.yaml B.yaml --interval 20` on a real server: exactly the two deployments exist, each tick
    of each schedule becomes a run of that config, every run that ran completed, and each run of the iterative
    config added exactly one round (runs overlap: a run takes longer than the interval here)."""
    import json
    import os
    import signal
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.conftest import small_config
    from tests.test_deployment import _completed_rounds

    a = tmp_path / "magrpo-tiny.yaml"
    a.write_text(json.dumps(small_config(tmp_path / "data-a")))  # JSON is YAML
    it = small_config(tmp_path / "data-b")
    it["algorithm"] = "madpo-iter"
    it["trainer"] = {"num_iterations": 20, "max_new_tokens": 8, "preference_num_candidates": 4,
                     "num_train_epochs": 1, "eval_num_samples": 2, "temperature": 1.0}
    b = tmp_path / "madpo-iter-tiny.yaml"
    b.write_text(json.dumps(it))
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        p = _serve(tmp_path / "home", port, log, str(a), str(b), "--interval", "20")
        try:
            rec = _wait_for_record(tmp_path / "home", p, log_path)
            text = log_path.read_text()
            assert "train-magrpo/tiny, train-madpo-iter/tiny, every 20 s" in text, text[-2000:]

            def runs() -> dict[str, list]:
                with temporary_settings(updates={PREFECT_API_URL: rec["url"]}):
                    with get_client(sync_client=True) as client:
                        names = {d.id: f"{client.read_flow(d.flow_id).name}/{d.name}" for d in client.read_deployments()}
                        out: dict[str, list] = {n: [] for n in names.values()}
                        started = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                            any_=[t for t in StateType if t not in (StateType.SCHEDULED, StateType.PENDING)])))
                        for r in client.read_flow_runs(flow_run_filter=started, limit=200):  # not the ~100 ahead
                            if r.parent_task_run_id is not None:  # a round's subflow run, inside its flow run
                                continue
                            out.setdefault(names.get(r.deployment_id, f"no deployment: {r.name}"), []).append(r)
                return out

            def done(n: int) -> bool:
                now = runs()
                for rs in now.values():  # a run that ended did so completed (read while waiting: fail fast)
                    bad = [(r.name, r.state.type.value, r.state.message) for r in rs
                           if r.state.is_final() and r.state.type.value != "COMPLETED"]
                    assert not bad, f"{bad}\n{log_path.read_text()[-4000:]}"
                return len(now) >= 2 and all(sum(r.state.is_completed() for r in rs) >= n for rs in now.values())

            t0 = time.time()
            while not done(2):
                assert time.time() - t0 < 600 and p.poll() is None, log_path.read_text()[-4000:]
                time.sleep(3)
            final = runs()
            assert set(final) == {"train-magrpo/tiny", "train-madpo-iter/tiny"}  # no other flow, no run without one
            for name, rs in final.items():
                assert all(r.parameters["config_path"] == str(a if "magrpo" in name else b) for r in rs)
                starts = sorted(r.expected_start_time for r in rs)
                gaps = {round((y - x).total_seconds()) for x, y in zip(starts, starts[1:])}
                assert all(g > 0 and g % 20 == 0 for g in gaps), (name, gaps)  # at most one run per tick
            its = final["train-madpo-iter/tiny"]  # (the runs the server scheduled ahead are left out)
            completed = sum(r.state.is_completed() for r in its)
            running = sum(r.state.is_running() for r in its)
            # each completed run added one round (overlapping runs never share one); a running run may have too
            assert completed <= _completed_rounds(it, "madpo-iter") <= completed + running
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=120)
                except Exception:  # noqa: BLE001
                    os.killpg(p.pid, signal.SIGKILL)
