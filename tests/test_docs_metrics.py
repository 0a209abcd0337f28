"""The 'Dataset formats and logged metrics' page names every metric each trainer logs: tiny runs of every trainer
family, tracked in MLflow, and each logged name (agent and turn indices generalized) must be on the page."""

import re
import sqlite3
from pathlib import Path

import pytest

from coopflow.flows import driver as D
from coopflow.schemas.config import validate_config
from tests.conftest import small_config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "datasets-and-metrics.md"
SMALL = {"num_train_epochs": 1, "max_new_tokens": 8, "eval_num_samples": 2}
PREFERENCE = {**SMALL, "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "train_batch_size": 2,
              "eval_interval": 0}
TRAINERS = {
    "magrpo": {},
    "iac": {"critic": {"critic_model": "tiny"},
            "trainer": {**SMALL, "num_turns": 1, "rollout_buffer_size": 2, "eval_interval": 0}},
    "maac": {"critic": {"critic_model": "tiny"},
             "trainer": {**SMALL, "num_turns": 1, "rollout_buffer_size": 2, "eval_interval": 0}},
    "madpo": {"trainer": PREFERENCE},
    "marlhf": {"trainer": {**PREFERENCE, "num_generations": 2, "rollout_buffer_size": 2,
                           "reward_num_train_epochs": 1}},
    "madpo-iter": {"trainer": {**SMALL, "num_iterations": 2, "preference_num_candidates": 4, "temperature": 1.0}},
}


def documented() -> set[str]:
    return set(re.findall(r"`([a-z_<>]+(?:/[a-z_<>@0-9]+)+|final_model_saved)`", PAGE.read_text()))


def general(name: str) -> str:
    return re.sub(r"turn_\d+", "turn_<t>", re.sub(r"agent_\d+", "agent_<i>", name))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(TRAINERS))
def test_every_metric_a_trainer_logs_is_documented(tmp_path, algorithm, pinned_threads):
    cfg = small_config(tmp_path)
    cfg.update(TRAINERS[algorithm])
    cfg["tracking"] = {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"}
    D.run_inline(validate_config(cfg, algorithm), tracking=True)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        logged = {general(k) for (k,) in con.execute("select distinct key from metrics")}
    assert len(logged) > 5
    missing = sorted(logged - documented())
    assert not missing, f"{algorithm} logs metrics {PAGE.name} does not name: {missing}"


def test_the_page_lists_names_in_the_general_form():
    names = documented()
    assert {"turn_<t>/reward_mean", "agent_<i>/policy_loss", "dpo/loss", "reward_model/accuracy",
            "iter/current_iteration", "critic/value_loss"} <= names
    assert not [n for n in names if re.search(r"(agent|turn)_\d", n)]
