"""Scale-out on existing engines (issue 21): reward fan-out through a process pool, Dask and Ray with scores
identical to serial scoring; agents as Ray actors with the `mp` workers' samples and weights."""

import os
import time
from pathlib import Path

import pytest
import torch

from coopflow.schemas.config import RayConfig, validate_config
from coopflow.flows.driver import run_inline
from coopflow.stages.score.executors import make_executor
from coopflow.stages.score.rewards import RewardCaller, RewardError
from coopflow.stages.score.scores import score_nodes, score_rewards
from tests import helpers
from tests.conftest import small_config

RAY_SETTINGS = RayConfig(local_num_cpus=2, object_store_mb=128)
EXTRAS = {"ray": ("ray", "pip install 'coopflow[ray]'"), "dask": ("distributed", "pip install 'coopflow[dask]'")}


def _needs(engine: str) -> None:
    """Skip (naming the extra to install) when the engine's optional package is not installed; .ci/run has them."""
    module, how = EXTRAS[engine]
    pytest.importorskip(module, reason=f"the {engine} tests need {module}: {how}")


def _rows(texts: dict[tuple[int, int, int], str]) -> list[dict]:
    """Rollout rows from {(item, agent, sample): text}."""
    return [{"step": 0, "turn": 0, "node_id": i, "item_id": i, "agent": a, "sample": s, "prompt": f"p{i}",
             "completion_text": t} for (i, a, s), t in sorted(texts.items())]


ROWS = _rows({(i, a, s): "w" * (1 + s + 3 * a + i) for i in range(3) for a in range(2) for s in range(3)})
ITEMS = {i: {"prompt": f"p{i}"} for i in range(3)}


def _scores(fn, executor=None, joint_mode="cross", timeout=30):
    caller = RewardCaller(fn, 2, timeout)
    caller.executor = executor
    return score_rewards(ROWS, ITEMS, caller, lambda x: x, joint_mode, 0)


@pytest.fixture
def executor(request):
    if request.param in EXTRAS:
        _needs(request.param)
    ex = make_executor(request.param, 2, None, RAY_SETTINGS)
    yield ex
    ex.close()


@pytest.mark.parametrize("executor", ["process", pytest.param("dask", marks=pytest.mark.slow),
                                      pytest.param("ray", marks=pytest.mark.slow)], indirect=True)
def test_fanned_out_scores_equal_serial_scores(executor):
    """27 cross-mode joint actions and the actor-critic per-node calls: the same rows in the same order."""
    serial = _scores(helpers.sleepy_length_ratio)
    assert _scores(helpers.sleepy_length_ratio, executor) == serial and len(serial) == 27
    assert _scores(helpers.sleepy_length_ratio, executor, "aligned") == _scores(helpers.sleepy_length_ratio,
                                                                                 None, "aligned")
    caller = RewardCaller(helpers.sleepy_length_ratio, 2, 30)
    nodes_serial = score_nodes(ROWS, ITEMS, caller, lambda x: x, 0)
    caller.executor = executor
    assert score_nodes(ROWS, ITEMS, caller, lambda x: x, 0) == nodes_serial


@pytest.mark.parametrize("executor", ["process", pytest.param("ray", marks=pytest.mark.slow)], indirect=True)
def test_a_fanned_out_reward_that_raises_or_hangs_is_named(executor):
    rows = _rows({(0, 0, 0): "a", (0, 1, 0): "ok", (1, 0, 0): "a", (1, 1, 0): "bad"})
    caller = RewardCaller(helpers.picky_reward, 2, 30)
    caller.executor = executor
    with pytest.raises(RewardError, match=r"KeyError from reward function tests.helpers:picky_reward on item 1, "
                                          r"joint action \[0, 0\]: \"no score for 'bad'\""):
        score_rewards(rows, {0: {}, 1: {}}, caller, lambda x: x, "aligned", 0)
    stuck = RewardCaller(helpers.stuck_reward, 2, 1.0)
    stuck.executor = executor
    t0 = time.time()
    with pytest.raises(RewardError, match=r"stuck_reward did not return within 1 s .*\(item 0, joint action"):
        score_rewards(rows, {0: {}, 1: {}}, stuck, lambda x: x, "aligned", 0)
    assert time.time() - t0 < 20
    assert _scores(helpers.sleepy_length_ratio, executor) == _scores(helpers.sleepy_length_ratio)  # usable again


def test_a_reward_that_cannot_travel_is_scored_serially_with_a_warning(caplog):
    ex = make_executor("process", 2)
    try:
        fn = lambda c1, c2: [float(len(c1[0]) > len(c2[0]))]  # noqa: E731 (a lambda cannot be pickled by name)
        with caplog.at_level("WARNING"):
            assert _scores(fn, ex) == _scores(fn)
        assert any("cannot be sent to worker processes" in r.getMessage() for r in caplog.records)
    finally:
        ex.close()


def test_reward_workers_leave_every_key_and_score_unchanged(tmp_path, pinned_threads):
    """A training run with reward.workers 2 (process pool): same run_key, rewards and weights as serial."""
    trainer = {**small_config(tmp_path)["trainer"], "num_generations": 2}
    reward = {"name": "tests.helpers:sleepy_length_ratio"}
    serial = run_inline(validate_config(small_config(tmp_path / "serial", trainer=trainer, reward=reward)))
    fanned = run_inline(validate_config(small_config(tmp_path / "fanned", trainer=trainer,
                                                     reward={**reward, "workers": 2})))
    assert Path(fanned["checkpoint"]).name == Path(serial["checkpoint"]).name
    assert fanned["reward_first"] == serial["reward_first"] and fanned["reward_last"] == serial["reward_last"]


# --- agents as Ray actors ------------------------------------------------------------------------------------

def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return {f"{a.name}.{k}": v for a in sorted(ckpt.glob("agent_*"))
            for k, v in load_file(a / "model.safetensors").items()}


@pytest.mark.slow
def test_ray_actors_give_the_mp_workers_samples_and_weights(tmp_path, pinned_threads):
    """parallel_training: ray on a local Ray instance (one CPU per agent) == mp workers (one thread each)."""
    _needs("ray")
    trainer = {**small_config(tmp_path)["trainer"], "num_generations": 2}
    mp_run = run_inline(validate_config(small_config(
        tmp_path / "mp", trainer={**trainer, "parallel_training": "mp", "agent_devices": ["cpu", "cpu"]})))
    ray_run = run_inline(validate_config(small_config(
        tmp_path / "ray", trainer={**trainer, "parallel_training": "ray"},
        ray={"local_num_cpus": 2, "object_store_mb": 128, "num_cpus_per_agent": 1})))
    assert Path(ray_run["checkpoint"]).name == Path(mp_run["checkpoint"]).name  # the same run_key
    assert ray_run["reward_first"] == mp_run["reward_first"] and ray_run["reward_last"] == mp_run["reward_last"]
    wm, wr = _weights(Path(mp_run["checkpoint"])), _weights(Path(ray_run["checkpoint"]))
    assert wm.keys() == wr.keys() and all(torch.equal(wm[k], wr[k]) for k in wm)
    ck = Path(ray_run["checkpoint"])
    assert (ck / "optimizer" / "agent_1.pt").is_file()


@pytest.mark.slow
def test_lora_agents_as_ray_actors_train_the_mp_adapters(tmp_path, pinned_threads):
    """agents.lora with parallel_training: ray: each actor holds its base copy + adapter; same adapters as mp."""
    _needs("ray")
    from tests.test_lora import _adapters

    trainer = {**small_config(tmp_path)["trainer"], "agent_learning_rate": 1e-2}
    agents = {"agent_model": "tiny", "num_agents": 2, "lora": {"r": 4, "alpha": 8}}
    mp_run = run_inline(validate_config(small_config(
        tmp_path / "mp", agents=agents, trainer={**trainer, "parallel_training": "mp", "agent_devices": ["cpu", "cpu"]})))
    ray_run = run_inline(validate_config(small_config(
        tmp_path / "ray", agents=agents, trainer={**trainer, "parallel_training": "ray"},
        ray={"local_num_cpus": 2, "object_store_mb": 128, "num_cpus_per_agent": 1})))
    assert ray_run["reward_last"] == mp_run["reward_last"]
    wm, wr = _adapters(Path(mp_run["checkpoint"])), _adapters(Path(ray_run["checkpoint"]))
    assert wm and wm.keys() == wr.keys() and all(torch.equal(wm[k], wr[k]) for k in wm)
