"""`coopflow ui`: the MLflow web UI over a data dir's tracking store, on 127.0.0.1 by default.

The UI is the full `mlflow` package (`pip install 'coopflow[ui]'`), pinned to the same version as the
`mlflow-skinny` coopflow logs with: an MLflow server refuses a SQLite store whose schema another MLflow
version migrated. Before starting the server this module checks both (the package and the store's schema
revision) and says what to do instead of a traceback from a server worker.

The server is `python -m mlflow server` with
- the data dir's tracking DB (`sqlite:///<data_dir>/mlflow.db`, or `--tracking-uri`) as the backend store;
- `<data_dir>/mlartifacts` as the artifact root of experiments created from the UI (runs logged by coopflow
  already carry `file://` artifact URIs under it, which the server reads directly);
- one worker and no job runner: it serves one user's browser, and the machine is usually busy training.
"""

import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from coopflow.flows.reaper import healthy, reap_with_parent
from coopflow.flows.tracking import schema_problem

INSTALL_HINT = "pip install 'coopflow[ui]'"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def missing_ui() -> str | None:
    """Why the MLflow UI cannot start in this environment (None: it can): the full `mlflow` package is
    missing, or its version differs from the `mlflow-skinny` that coopflow logs with."""
    full, skinny = _version("mlflow"), _version("mlflow-skinny")
    if full is None:
        return (f"the MLflow UI needs the full `mlflow` package (installed: mlflow-skinny {skinny}); "
                f"install it with: {INSTALL_HINT}")
    if skinny is not None and skinny != full:
        return (f"mlflow {full} and mlflow-skinny {skinny} are installed; the UI needs the same version of "
                f"both (reinstall with: {INSTALL_HINT})")
    return None


def server_command(uri: str, artifact_root: Path, host: str, port: int) -> list[str]:
    """The `mlflow server` command line for the store `uri` and the artifact root `artifact_root`."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
            "--default-artifact-root", artifact_root.as_uri(), "--artifacts-destination", artifact_root.as_uri(),
            "--host", host, "--port", str(port), "--workers", "1"]


def run_ui(data: Path, host: str = "127.0.0.1", port: int = 5000, tracking_uri: str | None = None,
           timeout: float = 120) -> int:
    """Start the MLflow UI over `data`'s tracking store, print its URL once it answers and serve until
    interrupted (or until the server exits). Returns the process exit code (2: it cannot start here)."""
    problem = missing_ui()
    uri = tracking_uri or f"sqlite:///{data / 'mlflow.db'}"
    if problem is None:
        problem = schema_problem(uri)
    if problem is not None:
        print(f"coopflow: {problem}", file=sys.stderr)
        return 2
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        print(f"coopflow: no tracking DB at {uri.removeprefix('sqlite:///')} yet (run a flow first); the UI "
              "starts with an empty store", file=sys.stderr)
    artifact_root = data / "mlartifacts"
    artifact_root.mkdir(parents=True, exist_ok=True)
    # no GenAI job runner (seven huey consumer processes that browsing runs never uses), no telemetry
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, "MLFLOW_TRACKING_URI": uri,
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(server_command(uri, artifact_root, host, port), env=env, start_new_session=True)
    reap_with_parent(server.pid, group=True)  # the server goes with this process, also after a kill -9
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a plain kill stops the server too (finally below)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        t0 = time.time()
        while not healthy(url):
            if server.poll() is not None:
                print(f"coopflow: the MLflow server exited ({server.returncode}) before answering on {url}",
                      file=sys.stderr)
                return server.returncode or 1
            if time.time() - t0 > timeout:
                print(f"coopflow: the MLflow server did not answer on {url} within {timeout:.0f} s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"MLflow UI: {url}  (tracking store {uri}; Ctrl-C stops it)", flush=True)
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # its own session: the uvicorn/gunicorn workers go with it
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
