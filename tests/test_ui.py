"""`coopflow ui`: the MLflow web UI over a data dir's tracking store.

Fast tests: the install hint without the full mlflow, the schema check, the server command line. The slow
test trains a tiny run, starts `coopflow ui` on 127.0.0.1 and loads the experiment's runs page, the run page,
its artifacts page and the table of its joint answers in headless Chromium (Debian's `chromium`), checking that
the run, its metrics, its lineage tags, its artifacts and a chosen update's completions and reward appear; it
skips when Chromium or the full mlflow is not installed.
"""

import html
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[1]


def test_ui_without_the_full_mlflow_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from coopflow.flows import ui
    from coopflow.flows.cli import main

    monkeypatch.setattr(ui, "_version", lambda dist: None if dist == "mlflow" else "3.17.2")
    assert main(["ui", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs the full `mlflow` package" in err and "pip install 'coopflow[ui]'" in err
    monkeypatch.setattr(ui, "_version", lambda dist: "3.18.0" if dist == "mlflow" else "3.17.2")
    assert "mlflow 3.18.0 and mlflow-skinny 3.17.2" in ui.missing_ui()


def test_the_ui_extra_pins_the_same_mlflow_as_the_base_dependency():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    skinny = [d for d in project["dependencies"] if d.startswith("mlflow-skinny")]
    assert skinny == ["mlflow-skinny==3.17.2"] and project["optional-dependencies"]["ui"] == ["mlflow==3.17.2"]


def test_schema_check_tells_a_newer_db_from_an_upgradable_one(tmp_path):
    from coopflow.flows.tracking import _prepare_sqlite
    from coopflow.flows.tracking import schema_problem

    _prepare_sqlite(tmp_path / "mlflow.db", tmp_path)  # this MLflow's migrated empty store
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert schema_problem(uri) is None
    assert schema_problem(f"sqlite:///{tmp_path / 'none.db'}") is None  # the server creates it
    assert schema_problem("postgresql://db/mlflow") is None
    con = sqlite3.connect(tmp_path / "mlflow.db")
    with con:
        con.execute("UPDATE alembic_version SET version_num = 'f00df00df00d'")  # a revision from a later MLflow
    assert "written by a newer MLflow" in schema_problem(uri)
    with con:
        con.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")  # MLflow 1.x's first revision
    con.close()
    assert f"mlflow db upgrade {uri}" in schema_problem(uri)


def test_a_run_refuses_a_tracking_db_from_a_newer_mlflow_in_one_line(tmp_path):
    """A data dir whose mlflow.db a newer MLflow wrote: `coopflow run` says so before Prefect starts (exit 2)."""
    from coopflow.flows.tracking import _prepare_sqlite

    _prepare_sqlite(tmp_path / "mlflow.db", tmp_path)
    con = sqlite3.connect(tmp_path / "mlflow.db")
    with con:
        con.execute("UPDATE alembic_version SET version_num = 'f00df00df00d'")
    con.close()
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "COOPFLOW_HOME")}
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config", "configs/magrpo-story.yaml",
                        "--set", f"data_dir={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "written by a newer MLflow" in r.stderr and "Traceback" not in r.stderr


def test_server_command_binds_the_host_and_serves_the_data_dir(tmp_path):
    from coopflow.flows.ui import server_command

    cmd = server_command("sqlite:///x/mlflow.db", tmp_path / "mlartifacts", "127.0.0.1", 5123)
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "server"]
    opts = dict(zip(cmd[4::2], cmd[5::2]))
    assert opts == {"--backend-store-uri": "sqlite:///x/mlflow.db", "--host": "127.0.0.1", "--port": "5123",
                    "--default-artifact-root": (tmp_path / "mlartifacts").as_uri(),
                    "--artifacts-destination": (tmp_path / "mlartifacts").as_uri(), "--workers": "1"}


# --- the UI in a browser ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _dom(chromium: str, url: str, *needles: str, tries: int = 3) -> str:
    """The page's DOM after its scripts ran (headless Chromium), retried while a needle is still missing
    (a loaded machine can leave the app's fetches unfinished within the virtual-time budget)."""
    for _ in range(tries):
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                            "--virtual-time-budget=20000", "--dump-dom", url],
                           capture_output=True, text=True, timeout=180)
        if all(n in r.stdout for n in needles):
            break
    return r.stdout


@pytest.mark.slow
def test_coopflow_ui_shows_a_runs_metrics_lineage_and_artifacts(prefect_harness, tmp_path):
    from coopflow.flows.ui import missing_ui

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium)")
    if missing_ui():
        pytest.skip(f"the MLflow UI cannot start here: {missing_ui()}")
    from coopflow.flows.train import train_magrpo

    s = train_magrpo(config=small_config(tmp_path))
    run_id = s["mlflow_run_id"]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    log = tmp_path / "ui.log"
    with open(log, "w") as out:
        ui = subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "ui", "--data-dir", str(tmp_path), "--port",
                               str(port)], cwd=REPO, env=env, stdout=out, stderr=out, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while f"MLflow UI: {base}" not in log.read_text():  # printed once the server answers /health
            assert ui.poll() is None and time.time() - t0 < 180, log.read_text()[-3000:]
            time.sleep(1)
        exp = _json(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=coopflow")["experiment"]
        run = _json(f"{base}/ajax-api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
        name = run["info"]["run_name"]
        assert run["info"]["experiment_id"] == exp["experiment_id"] and run["info"]["status"] == "FINISHED"
        with urllib.request.urlopen(f"{base}/get-artifact?path=summary.json&run_uuid={run_id}", timeout=30) as r:
            assert json.loads(r.read())["mlflow_run_id"] == run_id  # the UI's artifact reads reach the data dir

        page = f"{base}/#/experiments/{exp['experiment_id']}"
        runs = _dom(chromium, f"{page}/runs", name)
        assert name in runs, runs[-2000:]
        overview = _dom(chromium, f"{page}/runs/{run_id}", "turn_1/reward_mean", "lineage.taskset")
        for needle in (name, "turn_1/reward_mean", "eval/turn_1/reward_mean", "lineage.taskset", "Finished"):
            assert needle in overview, needle
        artifacts = _dom(chromium, f"{page}/runs/{run_id}/artifacts", "lineage.json")
        for needle in ("rollouts", "lineage.json", "summary.json"):
            assert needle in artifacts, needle
        # a joint action of a chosen update, read off the table view of the run's rollouts
        with urllib.request.urlopen(f"{base}/get-artifact?path=rollouts/segment_0001.json&run_uuid={run_id}",
                                    timeout=30) as r:
            table = json.loads(r.read())
        cols = table["columns"]
        chosen = [row for row in table["data"] if row[cols.index("update")] == 1][0]  # the second update
        completions = [chosen[cols.index(f"agent_{a}")] for a in (0, 1)]
        view = html.unescape(_dom(chromium, f"{page}/runs/{run_id}/artifacts/rollouts/segment_0001.json",
                                  "advantage_0"))
        for needle in ("View as table", "agent_0", "advantage_1", str(chosen[cols.index("reward")]), *completions):
            assert needle in view, needle
    finally:
        ui.send_signal(signal.SIGTERM)  # `coopflow ui` stops its server (and the server's workers) on the way out
        ui.wait(timeout=60)
    t0 = time.time()
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                break
        assert time.time() - t0 < 30, "the MLflow server outlived `coopflow ui`"
        time.sleep(0.5)
