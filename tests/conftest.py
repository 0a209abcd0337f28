"""Test isolation: every piece of state goes under one temp dir, set before Prefect/MLflow import."""

import os
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="coopflow-tests-"))
os.environ["COOPFLOW_HOME"] = str(_ROOT / "home")
os.environ.pop("PREFECT_API_URL", None)
os.environ["PREFECT_HOME"] = str(_ROOT / "prefect")
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_ROOT / 'mlflow.db'}"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["HF_HOME"] = str(_ROOT / "hf")
if os.environ.get("PYTEST_XDIST_WORKER"):  # parallel test workers share the cores: one torch thread each
    os.environ["OMP_NUM_THREADS"] = "1"
os.environ["COOPFLOW_CACHE"] = str(_ROOT / "cache")  # one migrated MLflow DB template for every test's data dir

from coopflow.flows.env import configure  # noqa: E402

configure(str(_ROOT / "home"))

BASE = {
    "agents": {"agent_model": "tiny", "num_agents": 2},
    "taskset": {"name": "story-length-ratio", "num_items": 4, "num_eval_items": 2},
    "trainer": {"num_train_epochs": 1, "agent_learning_rate": 1e-3, "num_generations": 2, "max_new_tokens": 8,
                "temperature": 1.0, "top_p": 1.0, "top_k": 50, "num_turns": 1, "rollout_buffer_size": 2,
                "logging_steps": 1, "eval_interval": 0, "eval_num_samples": 2},
}


def small_config(tmp: Path, **sections) -> dict:
    """A tiny, fast run config dict rooted at `tmp` (sections merge into BASE)."""
    cfg = {k: dict(v) for k, v in BASE.items()}
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    cfg["data_dir"] = str(tmp)
    return cfg


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model + locally trained tokenizer (built once per session)."""
    from coopflow.stages.agents.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server for every flow test in the session."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture
def pinned_threads():
    """One torch thread in this process, restored after: runs compared for exact equality (in-process vs mp
    workers, which split this process's thread count between them) then reduce floats in the same order."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield 1
    torch.set_num_threads(before)
