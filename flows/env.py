"""Embedded defaults: every piece of state under one data dir, set before Prefect/MLflow import.

`configure(data_dir)` fills (without overriding anything the user exported):
- PREFECT_HOME=<data>/prefect (the local/ephemeral Prefect server's SQLite DB and results),
  a 120 s ephemeral start-up timeout (the 20 s default is too short on a 2-core machine), analytics off;
- MLFLOW_TRACKING_URI=sqlite:///<data>/mlflow.db, telemetry off;
- HF offline-friendly quiet settings;
- the `stages` loggers at INFO (unless already set), so a run shows the stages' heartbeats (generation
  tokens/s, joint actions scored; `stages.common.progress`) — Prefect's console shows WARNING and up otherwise.
"""

import logging
import os
from pathlib import Path


def data_dir(explicit: str | None = None) -> Path:
    """The project data dir: explicit > $COOPFLOW_HOME > ./.coopflow (a path or a file:// URI)."""
    from coopflow.schemas.config import data_dir_path

    return data_dir_path(explicit)


def configure(explicit: str | None = None) -> Path:
    """Export the embedded defaults for `data_dir` and return it (idempotent)."""
    d = data_dir(explicit)
    d.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("COOPFLOW_HOME", str(d))
    defaults = {
        "PREFECT_HOME": str(d / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        # Record task runs in batches: cuts the server's CPU per task run ~3x (orchestration notes §1.12).
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        # `coopflow serve` checks for triggered runs every 2 s (Prefect's default 10 s delays every start).
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "stages,artifacts",
        "DO_NOT_TRACK": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{d / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_SKIP_PIP_REQUIREMENTS_CHECK": "true",
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    stages = logging.getLogger("coopflow.stages")
    if stages.level == logging.NOTSET:
        stages.setLevel(logging.INFO)
    return d
