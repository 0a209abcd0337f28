"""Checkpoints written beside the next phase (`checkpoint_write: background`): the same files as a write before going
on, recorded only once complete, never read while the next update changes the weights, failures surfacing."""

import json
import threading
import time
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.artifacts.store import PendingDir
from coopflow.schemas.config import validate_config
from tests.conftest import small_config

# --- the store: put_dir_behind ------------------------------------------------------------------------------------


def _slow_writer(text: str, delay: float, log: list):
    """A `start` for put_dir_behind: a thread writes `a.txt` after `delay`; finish() joins it, returns a digest."""
    from coopflow.artifacts.store import file_digest

    def start(tmp: Path):
        def write():
            time.sleep(delay)
            (tmp / "a.txt").write_text(text)
            log.append(("written", text))

        t = threading.Thread(target=write)
        t.start()
        (tmp / "b.txt").write_text("now")  # written at once: hashed at commit

        def finish():
            t.join()
            log.append(("finished", text))
            return {"a.txt": file_digest(tmp / "a.txt")}

        return finish

    return start


def test_a_write_behind_is_recorded_only_once_complete_and_equals_put_dir(tmp_path):
    store, log = ArtifactStore(tmp_path / "s"), []
    pending = store.put_dir_behind("checkpoint", "k1", _slow_writer("weights", 0.3, log))
    assert isinstance(pending, PendingDir) and pending.key == "k1" and not pending.done
    assert not store.path("checkpoint", "k1").exists()  # nothing recorded while the write runs
    assert ArtifactStore(tmp_path / "s").find("checkpoint", "k1") is None  # (another process sees nothing)
    ref = store.find("checkpoint", "k1")  # a lookup waits for it and commits it
    assert log == [("written", "weights"), ("finished", "weights")] and pending.done and pending.result() == ref
    other = ArtifactStore(tmp_path / "t")
    same = other.put_dir("checkpoint", "k1", lambda d: [(d / "a.txt").write_text("weights"),
                                                       (d / "b.txt").write_text("now")])
    assert same.sha256 == ref.sha256  # the manifest of a write-behind is the manifest of a plain write
    assert store.verify_all()[1] == [] and store.put_dir_behind("checkpoint", "k1", None) == ref  # stored: reused


def test_one_write_behind_at_a_time_and_after_runs_once_committed(tmp_path):
    store, log, seen = ArtifactStore(tmp_path), [], []
    first = store.put_dir_behind("checkpoint", "k1", _slow_writer("one", 0.3, log))
    first.after(lambda ref: seen.append(ref.key))
    assert seen == []
    second = store.put_dir_behind("checkpoint", "k2", _slow_writer("two", 0.0, log))
    assert first.done and seen == ["k1"]  # the earlier write was committed before the next one began
    assert log[:2] == [("written", "one"), ("finished", "one")]
    assert store.settle() >= 0 and second.done and store.find("checkpoint", "k2") is not None


def test_a_failed_write_behind_raises_where_it_is_settled_and_leaves_nothing(tmp_path):
    store = ArtifactStore(tmp_path)

    def start(tmp: Path):
        (tmp / "part.bin").write_bytes(b"x")

        def finish():
            raise OSError(28, "No space left on device")

        return finish

    pending = store.put_dir_behind("checkpoint", "k1", start)
    from coopflow.artifacts.store import StoreFullError

    with pytest.raises(StoreFullError, match="no space left"):
        store.settle()
    with pytest.raises(StoreFullError):
        pending.result()  # the same error on every call
    assert store.find("checkpoint", "k1") is None  # not stored, and no temp dir is left
    assert not [p for p in (tmp_path / "checkpoint").iterdir()]


# --- a run: the same checkpoints, whichever way they are written ---------------------------------------------------


@pytest.mark.parametrize("setting, behind", [("auto", False), ("background", True), ("inline", False)])
def test_checkpoint_write_auto_writes_inline_on_cpus(tmp_path, monkeypatch, setting, behind):
    """auto: background only where an agent runs on a GPU; on CPUs the write takes the cores the next phase needs
    (measured no faster end to end), so it is written before the run goes on."""
    from coopflow.flows.driver import run_inline

    calls = []
    real = ArtifactStore.put_dir_behind
    monkeypatch.setattr(ArtifactStore, "put_dir_behind", lambda self, *a: calls.append(a[1]) or real(self, *a))
    run_inline(validate_config(small_config(tmp_path, checkpoint_write=setting)))
    assert bool(calls) == behind


def _manifests(root: Path) -> dict[str, dict]:
    """Every stored checkpoint's manifest (file digests) by key."""
    out = {}
    for d in sorted((root / "artifacts" / "checkpoint").iterdir()):
        if not d.name.startswith("."):
            out[d.name] = json.loads((d / "manifest.json").read_text())["files"]
    return out


def test_background_checkpoints_equal_written_ones_even_when_the_write_is_slow(tmp_path, monkeypatch,
                                                                              pinned_threads):
    """Three segments with each agent's write held up 0.5 s on its writer thread (in process): the next segment
    generates meanwhile, and its update waits for the write. Every checkpoint (the weights-only ones the run keeps
    too) is byte-identical to a run that writes before going on: had an update changed the weights while they were
    written, the files would differ."""
    from coopflow.flows.driver import run_inline
    from coopflow.stages.agents import models

    real, spans = models._save_and_hash, []

    def slow(agent, out, index):
        t0 = time.perf_counter()
        time.sleep(0.5)
        digests = real(agent, out, index)
        spans.append((t0, time.perf_counter()))
        return digests

    trainer = {**small_config(tmp_path)["trainer"], "rollout_buffer_size": 1}
    runs = {}
    for background in (True, False):
        d = tmp_path / str(background)
        cfg = validate_config(small_config(d, checkpoint_every=2, trainer=trainer,
                                           checkpoint_write="background" if background else "inline",
                                           taskset={"name": "story-length-ratio", "num_items": 6, "num_eval_items": 2}))
        if background:
            monkeypatch.setattr(models, "_save_and_hash", slow)
        else:
            monkeypatch.setattr(models, "_save_and_hash", real)
        runs[background] = (run_inline(cfg), _manifests(d))
    (bg, bg_files), (fg, fg_files) = runs[True], runs[False]
    assert Path(bg["checkpoint"]).name == Path(fg["checkpoint"]).name  # the same run_key
    assert len(bg_files) == 3 and bg_files == fg_files  # byte-identical: every checkpoint, every file
    assert len(spans) == 3 * 2  # three checkpoints of two agents, each written on a writer thread
    assert bg["executed"]["checkpoint"] == 3 and ArtifactStore(tmp_path / "True" / "artifacts").verify_all()[1] == []
    assert bg["seconds"]["checkpoint_wait"] > 0  # the updates waited for the held-up writes
    # training ends when the final checkpoint is committed: its held-up write, beside the evaluation, counts
    assert bg["seconds"]["checkpoint"] >= 0.5 and bg["train_seconds"] > bg["seconds"]["checkpoint"]


def test_an_optimizer_step_waits_for_a_write_still_reading_the_weights(tmp_path, tiny_model_dir, monkeypatch):
    """The second guard, where the agent lives: `ensure_optimizer` (every update's way to its optimizer) returns only
    once the agent's checkpoint write has ended, whoever forgot to wait for it."""
    from coopflow.stages.agents import models
    from coopflow.stages.agents.spec import specs_for

    agent = models.load_agent_state(specs_for([str(tiny_model_dir)], 1e-3)[0])
    real, ended = models._save_and_hash, []

    def slow(a, out, index):
        time.sleep(0.5)
        digests = real(a, out, index)
        ended.append(time.perf_counter())
        return digests

    monkeypatch.setattr(models, "_save_and_hash", slow)
    (tmp_path / "ckpt").mkdir()
    models.begin_save(agent, tmp_path / "ckpt", 0)
    assert not ended  # the write runs on its thread
    agent.ensure_optimizer()
    got = time.perf_counter()
    assert ended and got >= ended[0]
    digests, _ = models.finish_save(agent)
    assert "agent_0/model.safetensors" in digests and agent.writing is None


def test_an_agents_writer_flushes_its_files_to_the_disk_before_the_commit(tmp_path, tiny_model_dir, monkeypatch):
    """Each agent's checkpoint files are fsync'd by its own writer (beside the next phase, when written in the
    background), so the commit that records the key finds them on the disk already and does not wait for it."""
    from coopflow.artifacts import store as S
    from coopflow.stages.agents import models
    from coopflow.stages.agents.spec import specs_for

    agent = models.load_agent_state(specs_for([str(tiny_model_dir)], 1e-3)[0])
    flushed, real = [], S._fsync
    monkeypatch.setattr(S, "_fsync", lambda p: (flushed.append(Path(p)), real(p)))
    (tmp_path / "ckpt").mkdir()
    models.begin_save(agent, tmp_path / "ckpt", 0)
    digests, _ = models.finish_save(agent)  # no commit yet: only the writer has run
    assert "agent_0/model.safetensors" in digests
    assert {str(p.relative_to(tmp_path / "ckpt")) for p in flushed} == set(digests)


@pytest.mark.slow
def test_an_agent_worker_killed_while_writing_fails_the_run_in_words_and_the_rerun_equals_a_clean_run(tmp_path):
    """parallel_training mp: agent 0's worker is SIGKILLed on its writer thread while the next segment generates.
    The run fails naming the dead worker; no checkpoint of that write is visible; the rerun continues from what is
    stored and ends with a clean run's run_key and byte-identical files."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    child = ("import json, sys\nfrom coopflow.schemas.config import validate_config\n"
             "from coopflow.flows.driver import run_inline\n"
             "print('CHECKPOINT', run_inline(validate_config(json.loads(sys.argv[1])))['checkpoint'])\n")
    trainer = {**small_config(tmp_path)["trainer"], "rollout_buffer_size": 1, "parallel_training": "mp",
               "agent_devices": ["cpu", "cpu"]}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(data: Path, **extra):
        cfg = small_config(data, checkpoint_every=2, checkpoint_write="background", trainer=trainer)
        return subprocess.run([sys.executable, "-c", child, json.dumps(cfg)], cwd=repo, env={**env, **extra},
                              capture_output=True, text=True, timeout=600)

    killed = run(tmp_path / "killed", COOPFLOW_FAULT="checkpoint-write/agent0")  # (every worker inherits the spec)
    assert killed.returncode == 1 and "agent 0 worker: the worker process died (killed by signal 9)" in killed.stderr
    store = ArtifactStore(tmp_path / "killed" / "artifacts")
    assert store.verify_all()[1] == [] and not _manifests(tmp_path / "killed")  # nothing of the write is visible
    resumed, clean = run(tmp_path / "killed"), run(tmp_path / "clean")
    assert resumed.returncode == 0 and clean.returncode == 0, resumed.stderr[-2000:] + clean.stderr[-2000:]
    assert _manifests(tmp_path / "killed") == _manifests(tmp_path / "clean")  # every file, tokenizers included


def test_a_fault_spec_names_a_point_or_one_agent_at_it(monkeypatch):
    """COOPFLOW_FAULT=checkpoint-write kills at any agent's write, checkpoint-write/agent0 only at agent 0's (under
    mp every worker inherits the spec: the test that kills one worker must name it); @N counts the spec's matches."""
    from coopflow.artifacts import faults

    killed = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    for spec, points, expect in (("checkpoint-write", ["checkpoint-write/agent1"], 1),
                                 ("checkpoint-write/agent0", ["checkpoint-write/agent1"], 0),
                                 ("checkpoint-write/agent0", ["checkpoint-write/agent0"], 1),
                                 ("checkpoint-write@2", ["checkpoint-write/agent0", "checkpoint-write/agent1"], 1),
                                 ("checkpoint", ["checkpoint-write/agent0"], 0)):
        killed.clear()
        monkeypatch.setattr(faults, "_SEEN", faults.Counter())
        monkeypatch.setenv("COOPFLOW_FAULT", spec)
        for p in points:
            faults.hit(p)
        assert len(killed) == expect, (spec, points)
