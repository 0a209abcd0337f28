"""Retake the documentation's screenshots (a maintainer's tool; needs `pip install -e '.[ui]'` and Chromium).

    python docs/hooks/screenshots.py [--out docs/images]

What it does, in a fresh temporary data dir:

1. starts a local Prefect server with its web UI (the one `coopflow serve` starts) and runs the quickstart
   (`coopflow run train-magrpo --config configs/magrpo-story.yaml`) against it;
2. takes the Prefect UI's page of that flow run (its task runs on a timeline) -> `prefect-flow-run.png`;
3. starts `coopflow ui` over the data dir and takes the table view of the run's second segment of joint answers
   (the `rollouts/segment_0002.json` artifact coopflow logs to MLflow) -> `mlflow-rollouts.png`.

Screenshots come from headless Chromium (`--screenshot`, a fixed window, a virtual-time budget so the app's
scripts finish). Nothing here runs in the test suite; the images are committed.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shoot(chromium: str, url: str, out: Path, size: str = "1400,900", budget_ms: int = 25000) -> None:
    """A PNG of `url` after its scripts ran for `budget_ms` of virtual time."""
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars",
                    f"--window-size={size}", f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=300)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


def get_json(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "images"))
    ap.add_argument("--prefect-port", type=int, default=4291)
    ap.add_argument("--mlflow-port", type=int, default=5291)
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("headless Chromium is not installed (Debian: apt-get install -y chromium)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="coopflow-shots-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI")}
    env["COOPFLOW_HOME"] = str(data)
    procs: list[subprocess.Popen] = []
    try:
        # --- 1. a Prefect server with its UI, and the quickstart run against it
        home = data / "prefect"
        home.mkdir(parents=True)
        plog = data / "prefect-server.log"
        api = f"http://127.0.0.1:{args.prefect_port}/api"  # the UI's own calls go here too
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(args.prefect_port)], stdout=open(plog, "w"), stderr=subprocess.STDOUT,
                                  env={**env, "PREFECT_HOME": str(home), "PREFECT_UI_API_URL": api,
                                       "PREFECT_SERVER_UI_API_URL": api}, start_new_session=True)
        procs.append(server)
        t0 = time.time()
        while True:
            try:
                get_json(f"{api}/health")
                break
            except OSError:
                if server.poll() is not None or time.time() - t0 > 180:
                    raise RuntimeError(f"the Prefect server did not start; see {plog}") from None
                time.sleep(1)
        summary = data / "summary.json"
        subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config",
                        "configs/magrpo-story.yaml", "--summary-json", str(summary), "--no-progress"],
                       cwd=REPO, env={**env, "PREFECT_API_URL": api}, check=True, timeout=900)
        runs = get_json(f"{api}/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})
        flow_run = runs[0]["id"]
        shoot(chromium, f"http://127.0.0.1:{args.prefect_port}/runs/flow-run/{flow_run}",
              out / "prefect-flow-run.png")

        # --- 3. the run's joint answers, as the MLflow UI shows the table coopflow logged
        run_id = json.loads(summary.read_text())["mlflow_run_id"]
        ulog = data / "ui.log"
        ui = subprocess.Popen([sys.executable, "-m", "coopflow.flows.cli", "ui", "--port", str(args.mlflow_port)],
                              cwd=REPO, env=env, stdout=open(ulog, "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
        procs.append(ui)
        base = f"http://127.0.0.1:{args.mlflow_port}"
        t0 = time.time()
        while f"MLflow UI: {base}" not in ulog.read_text():
            if ui.poll() is not None or time.time() - t0 > 180:
                raise RuntimeError(f"coopflow ui did not start; see {ulog}")
            time.sleep(1)
        exp = get_json(f"{base}/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=coopflow")["experiment"]
        shoot(chromium, f"{base}/#/experiments/{exp['experiment_id']}/runs/{run_id}/artifacts/rollouts/"
                        "segment_0002.json", out / "mlflow-rollouts.png", size="1800,760")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
