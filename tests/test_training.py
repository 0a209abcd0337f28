"""Training through the stages directly (no Prefect): learning, replay on resume, kill-and-resume."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from coopflow.stages.agents.spec import specs_for
from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.planning.plan import plan_segments, plan_updates
from coopflow.flows.driver import run_inline
from tests.conftest import small_config
from tests.helpers import LEARNING_SEEDS, assert_learns, remove_segment

REPO = Path(__file__).resolve().parents[1]


def test_learning_moves_length_ratio_reward(tmp_path):
    """MAGRPO on the tiny model: over seeds 0-2 the reward of the last fifth is clearly above the first fifth
    (measured gains +0.24 … +0.52 over seeds 0-4), and evaluation after training beats the first fifth."""
    train, evals = [], []
    for seed in LEARNING_SEEDS:
        d = tmp_path / f"seed{seed}"
        cfg = validate_config(small_config(
            d, seed=seed, taskset={"name": "story-length-ratio", "num_items": 16, "num_eval_items": 4},
            trainer={**small_config(d)["trainer"], "num_train_epochs": 2, "num_generations": 4,
                     "max_new_tokens": 32, "rollout_buffer_size": 1}))
        s = run_inline(cfg)
        assert s["env_steps"] == 16 * 2 * 4
        train.append(s["reward_last"] - s["reward_first"])
        evals.append(s["eval"]["eval/turn_1/reward_mean"] - s["reward_first"])
    assert_learns(train, 0.2)
    assert_learns(evals, 0.1)


def test_plan_updates_and_segments():
    ups = plan_updates(n_items=5, epochs=2, buffer=2, joint_actions_per_item=4)
    assert [u.item_ids for u in ups] == [(0, 1), (2, 3), (4,)] * 2
    assert [u.env_step_base for u in ups] == [0, 8, 16, 20, 28, 36]
    assert [[u.index for u in s] for s in plan_segments(ups, 0)] == [[0, 1, 2], [3, 4, 5]]
    assert [[u.index for u in s] for s in plan_segments(ups, 4)] == [[0, 1, 2, 3], [4, 5]]


def test_resume_replays_stored_rollouts_without_generating(tmp_path):
    """Deleting the end checkpoint of a finished run: the rerun regenerates nothing and gets the same weights."""
    cfg = validate_config(small_config(tmp_path, checkpoint_every=2))
    first = run_inline(cfg)
    w_first = _weights(Path(first["checkpoint"]))
    store = ArtifactStore(tmp_path / "artifacts")
    key = Path(first["checkpoint"]).name
    remove_segment(store, key)  # the last segment's checkpoint, steps and metrics
    second = run_inline(cfg)
    assert "generate" not in second["executed"]  # replayed from stored rollouts
    assert second["executed"]["update"] > 0
    assert _weights(Path(second["checkpoint"])) .keys() == w_first.keys()
    for k, v in _weights(Path(second["checkpoint"])).items():
        assert torch.allclose(v, w_first[k], atol=1e-6), k


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for agent in sorted(ckpt.glob("agent_*")):
        for k, v in load_file(agent / "model.safetensors").items():
            out[f"{agent.name}.{k}"] = v
    return out


CHILD = """
import sys
from coopflow.schemas.config import validate_config
from coopflow.flows.driver import run_inline
import json
cfg = validate_config(json.loads(sys.argv[1]))
run_inline(cfg)
"""


def test_kill_and_resume_loses_no_completed_step(tmp_path):
    """SIGKILL mid-training; the rerun resumes from the checkpoint, replays stored steps, matches a clean run."""
    import json

    trainer = {**small_config(tmp_path)["trainer"], "num_generations": 2, "rollout_buffer_size": 1}
    killed_cfg = small_config(tmp_path / "killed", checkpoint_every=3, trainer=trainer,
                              taskset={"name": "story-length-ratio", "num_items": 8, "num_eval_items": 2},
                              reward={"name": "tests.helpers:slow_length_ratio"})
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(killed_cfg)], cwd=REPO, env=env)
    rollouts = tmp_path / "killed" / "artifacts" / "rollouts"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if rollouts.is_dir() and len([p for p in rollouts.iterdir() if not p.name.startswith(".")]) >= 5:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "child finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = ArtifactStore(tmp_path / "killed" / "artifacts")
    done = len([p for p in rollouts.iterdir() if not p.name.startswith(".")])
    ckpts = [p for p in (tmp_path / "killed" / "artifacts" / "checkpoint").iterdir() if not p.name.startswith(".")]
    assert 5 <= done < 8 and len(ckpts) in (1, 2)  # killed after the first checkpoint, before the end
    # --- rerun the same config in-process: generates only the missing updates
    resumed = run_inline(validate_config(killed_cfg))
    assert resumed["executed"]["generate"] == 8 - done
    # segments hold 3 updates: everything after the last stored checkpoint is updated again (replayed or new)
    assert resumed["executed"]["update"] == 8 - 3 * len(ckpts)
    # --- identical to an uninterrupted run
    clean = run_inline(validate_config({**killed_cfg, "data_dir": str(tmp_path / "clean")}))
    assert Path(resumed["checkpoint"]).name == Path(clean["checkpoint"]).name
    wr, wc = _weights(Path(resumed["checkpoint"])), _weights(Path(clean["checkpoint"]))
    for k in wc:
        assert torch.allclose(wr[k], wc[k], atol=1e-6), k
    assert resumed["reward_first"] == clean["reward_first"] and resumed["reward_last"] == clean["reward_last"]


def test_a_reward_that_raises_mid_run_fails_it_and_the_rerun_after_the_fix_continues(tmp_path, monkeypatch):
    """The reward's service goes down at step 3 of 4: the run fails naming the reward, the item and the joint
    action; once it is back, the same config reuses the stored rollouts and ends with the uninterrupted weights."""
    from coopflow.stages.score.rewards import RewardError
    from tests import helpers

    trainer = {**small_config(tmp_path)["trainer"], "rollout_buffer_size": 1}
    cfg = small_config(tmp_path / "run", trainer=trainer, reward={"name": "tests.helpers:outage_length_ratio"},
                       eval_before=False)  # (its reward calls would shift when the outage starts)
    helpers.REWARD_CALLS["n"] = 0
    monkeypatch.setenv("TEST_REWARD_DOWN_AFTER", "4")  # fails after a few steps
    with pytest.raises(RewardError, match=r"ConnectionError from reward function .*outage_length_ratio on item \S+, "
                                          r"joint action \[\d+, \d+\]: scoring service unavailable"):
        run_inline(validate_config(cfg))
    stored = len([p for p in (tmp_path / "run" / "artifacts" / "rollouts").iterdir() if not p.name.startswith(".")])
    assert 2 <= stored < 4
    monkeypatch.delenv("TEST_REWARD_DOWN_AFTER")  # the fix
    resumed = run_inline(validate_config(cfg))
    assert resumed["executed"]["generate"] == 4 - stored  # the stored steps' rollouts are reused
    clean = run_inline(validate_config({**cfg, "data_dir": str(tmp_path / "clean")}))
    assert Path(resumed["checkpoint"]).name == Path(clean["checkpoint"]).name
    wr, wc = _weights(Path(resumed["checkpoint"])), _weights(Path(clean["checkpoint"]))
    assert all(torch.equal(wr[k], wc[k]) for k in wc)


def test_a_run_that_fails_mid_segment_stops_its_worker_processes(tmp_path, monkeypatch):
    """parallel_training mp, the reward fails at update 3 of 4: the run's error surfaces and no agent worker process
    outlives it (a long-lived `coopflow serve` process must not keep a failed run's models in memory)."""
    import multiprocessing

    from coopflow.stages.score.rewards import RewardError
    from tests import helpers

    trainer = {**small_config(tmp_path)["trainer"], "rollout_buffer_size": 1, "parallel_training": "mp",
               "agent_devices": ["cpu", "cpu"]}
    cfg = small_config(tmp_path / "run", trainer=trainer, reward={"name": "tests.helpers:outage_length_ratio"},
                       eval_before=False)
    before = set(multiprocessing.active_children())
    helpers.REWARD_CALLS["n"] = 0
    monkeypatch.setenv("TEST_REWARD_DOWN_AFTER", "4")
    with pytest.raises(RewardError, match="scoring service unavailable"):
        run_inline(validate_config(cfg))
    assert [p for p in multiprocessing.active_children() if p not in before] == []


def test_mp_workers_match_in_process_training(tmp_path, pinned_threads):
    """parallel_training=mp (one worker process per agent) gives the same samples and weights as in-process."""
    trainer = {**small_config(tmp_path)["trainer"], "num_generations": 2}
    local = run_inline(validate_config(small_config(tmp_path / "local", trainer=trainer)))
    mp_trainer = {**trainer, "parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}
    par = run_inline(validate_config(small_config(tmp_path / "mp", trainer=mp_trainer)))
    assert par["reward_first"] == local["reward_first"] and par["reward_last"] == local["reward_last"]
    wl, wp = _weights(Path(local["checkpoint"])), _weights(Path(par["checkpoint"]))
    for k in wl:
        assert torch.allclose(wl[k], wp[k], atol=1e-5), k
    ck = Path(par["checkpoint"])
    assert (ck / "optimizer" / "agent_1.pt").is_file() and (ck / "agent_1" / "tokenizer.json").is_file()
    for run in (local, par):  # optimizer state is written without torch.save's CRC32 (the sha256 manifest checks it)
        _assert_no_crc32_and_loads(Path(run["checkpoint"]) / "optimizer" / "agent_1.pt")
    assert torch.serialization.get_crc32_options()  # this process's setting is back as it was


def _assert_no_crc32_and_loads(path: Path) -> None:
    import zipfile

    with zipfile.ZipFile(path) as z:
        records = [i for i in z.infolist() if i.file_size > 0 and "/data/" in i.filename]
    assert records and all(i.CRC == 0 for i in records), path
    state = torch.load(path, weights_only=True)
    assert state["state"] and all(torch.isfinite(v["exp_avg"]).all() for v in state["state"].values())


def test_mp_worker_errors_surface_with_agent_index(tmp_path):
    from coopflow.stages.agents.workers import WorkerPolicies

    with pytest.raises(FileNotFoundError, match="agent 0 worker"):
        WorkerPolicies(specs_for([str(tmp_path / "missing-model")], 1e-3))


def test_mp_tokenizers_load_while_the_workers_start(tiny_model_dir, monkeypatch):
    """The main process needs the agents' tokenizers (chat-template formatters): it loads them while the workers
    load their models, during start-up, not later inside the training clock (a first tokenizer load imports
    transformers' tokenizer stack: seconds)."""
    from coopflow.stages.agents import workers
    from coopflow.stages.agents.spec import AgentSpec

    calls = []
    real = workers.source_tokenizers
    monkeypatch.setattr(workers, "source_tokenizers", lambda sources: calls.append(list(sources)) or real(sources))
    pol = workers.WorkerPolicies([AgentSpec(str(tiny_model_dir), 1e-3, device="cpu")])
    try:
        assert calls == [[str(tiny_model_dir)]]
        toks = pol.tokenizers
        assert len(calls) == 1 and toks[0]("hello").input_ids
    finally:
        pol.close()


def test_thread_count_changes_no_key_and_no_weight_beyond_float_noise(tmp_path):
    """The same seed with 1 and 2 torch threads: the same run_key (keys are input-addressed) and the same weights
    up to float-reduction noise (on the tiny model they are byte-identical here; larger matmuls split across
    threads may differ in the last bits, see README "Reliability")."""
    script = ("import sys, torch; torch.set_num_threads(int(sys.argv[2])); sys.path.insert(0, %r)\n"
              "import tests.conftest\n"
              "from pathlib import Path\n"
              "from tests.conftest import small_config\n"
              "from coopflow.schemas.config import validate_config\n"
              "from coopflow.flows.driver import run_inline\n"
              "print(run_inline(validate_config(small_config(Path(sys.argv[1]))))['checkpoint'])") % str(REPO)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    ckpts = []
    for threads in (1, 2):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"t{threads}"), str(threads)], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        ckpts.append(Path(out.stdout.strip().splitlines()[-1]))
    assert ckpts[0].name == ckpts[1].name
    w1, w2 = _weights(ckpts[0]), _weights(ckpts[1])
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=1e-5), k


def test_a_worker_that_dies_mid_op_is_named_in_words(tiny_model_dir):
    """A worker killed while it runs an op (the parent's send went through, its reply never comes) fails the call
    with the same one line as a worker found dead when sending to it, not a remote traceback section."""
    from coopflow.stages.agents.spec import AgentSpec
    from coopflow.stages.agents.workers import WorkerPolicies
    from tests.helpers import die_now

    pol = WorkerPolicies([AgentSpec(str(tiny_model_dir), 1e-3, device="cpu")])
    try:
        with pytest.raises(RuntimeError) as err:
            pol.run(die_now, [()])
        assert str(err.value) == "agent 0 worker: the worker process died (killed by signal 9)"
    finally:
        pol.close()
