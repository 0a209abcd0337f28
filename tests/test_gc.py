"""Checkpoint size and retention: optimizer state only where resuming needs it, `coopflow gc`, the disk estimate."""

import hashlib
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.agents.checkpoint import find_checkpoint, is_weights_only, weights_only_key
from coopflow.flows.driver import run_inline
from tests.conftest import small_config

ONE_PER_SEGMENT = {**small_config(Path("."))["trainer"], "rollout_buffer_size": 1}  # 4 updates -> 4 segments


def _cfg(tmp: Path, **kw) -> dict:
    return small_config(tmp, checkpoint_every=1, trainer=ONE_PER_SEGMENT, eval_before=False, **kw)


def _digests(ckpt: str | Path) -> dict[str, str]:
    root = Path(ckpt)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.safetensors"))}


def _listing(store: ArtifactStore) -> set[tuple[str, str]]:
    return set(store.artifacts())


def test_intermediate_checkpoints_drop_optimizer_state_and_resume_stays_exact(tmp_path):
    """checkpoint_optimizer: last (the default): every segment checkpoint but the final one is weights-only; killing
    the run after its third checkpoint (the rest deleted) and rerunning replays from the last full checkpoint
    and ends with the weights of a run that kept every optimizer state."""
    full = run_inline(validate_config(_cfg(tmp_path / "all", checkpoint_optimizer="all")))
    last_cfg = validate_config(_cfg(tmp_path / "last"))
    assert last_cfg.checkpoint_optimizer == "last"
    last = run_inline(last_cfg)
    store = ArtifactStore(tmp_path / "last" / "artifacts")
    ckpts = [key for _, key in store.artifacts("checkpoint")]
    final = Path(last["checkpoint"]).name
    assert Path(full["checkpoint"]).name == final  # the final checkpoint (run_key) is keyed as before
    assert len(ckpts) == 4 and [k for k in ckpts if not is_weights_only(k)] == [final]
    for key in ckpts:
        has_opt = (store.path("checkpoint", key) / "optimizer").is_dir()
        assert has_opt == (key == final)
    assert _digests(last["checkpoint"]) == _digests(full["checkpoint"])
    # a weights-only checkpoint is about a third of a full one (weights, without AdamW's two moments)
    slim = next(k for k in ckpts if is_weights_only(k))
    assert store.size("checkpoint", slim) < 0.5 * store.size("checkpoint", final)
    assert store.verify_all()[1] == []

    # --- "killed" after segment 3: the end checkpoint and segment 4's manifests are gone, 3 is weights-only
    for kind in ("checkpoint", "steps", "metrics"):
        store.remove(kind, final)
    resumed = run_inline(last_cfg)
    assert "generate" not in resumed["executed"]  # replayed from the stored rollouts, no generation
    assert resumed["executed"]["update"] == 4  # segments 1-3 rebuilt from the start (no full checkpoint left) + 4
    assert Path(resumed["checkpoint"]).name == final
    assert _digests(resumed["checkpoint"]) == _digests(full["checkpoint"])
    assert sorted(k for _, k in store.artifacts("checkpoint")) == sorted(ckpts)  # rebuilt ones weights-only again


def test_none_keeps_no_optimizer_state_and_a_longer_run_continues_exactly(tmp_path):
    """checkpoint_optimizer: none: even the final checkpoint is weights-only; a longer run of the same config
    replays the stored updates to rebuild the optimizer state and equals an uninterrupted longer run."""
    one = {**ONE_PER_SEGMENT, "num_train_epochs": 1}
    two = {**ONE_PER_SEGMENT, "num_train_epochs": 2}
    d = tmp_path / "none"
    s1 = run_inline(validate_config(small_config(d, checkpoint_every=2, trainer=one, eval_before=False,
                                                 checkpoint_optimizer="none")))
    assert is_weights_only(Path(s1["checkpoint"]).name)
    assert not (Path(s1["checkpoint"]) / "optimizer").exists()
    s2 = run_inline(validate_config(small_config(d, checkpoint_every=2, trainer=two, eval_before=False,
                                                 checkpoint_optimizer="none")))
    assert "generate" in s2["executed"] and s2["executed"]["update"] == 8  # 4 replayed + 4 new
    ref = run_inline(validate_config(small_config(tmp_path / "ref", checkpoint_every=2, trainer=two,
                                                  eval_before=False, checkpoint_optimizer="all")))
    assert _digests(s2["checkpoint"]) == _digests(ref["checkpoint"])


def test_a_held_run_lock_records_its_keys(tmp_path):
    store = ArtifactStore(tmp_path)
    assert store.held_locks() == []
    with store.lock("run-k", ["a", "b"]):
        (held,) = store.held_locks()
        assert held["name"] == "run-k" and held["keys"] == ["a", "b"] and held["since"] > 0
    assert store.held_locks() == []


def test_gc_plan_keeps_what_recorded_runs_need(tmp_path):
    """Without MLflow: roots = one run's final checkpoint. Another run's artifacts are unneeded; the lineage of
    the recorded one (segments, rollouts, scores, advantages) stays; a held lock protects its run's keys."""
    from coopflow.stages.operations.gc import Roots, apply_gc, plan_gc

    a = run_inline(validate_config(_cfg(tmp_path, checkpoint_optimizer="all")))
    store = ArtifactStore(tmp_path / "artifacts")
    before_b = _listing(store)
    b = run_inline(validate_config(_cfg(tmp_path, seed=1)))
    evals = {x for x in before_b if x[0] == "eval"}  # a's evaluation, which a flow run's lineage names
    roots = Roots(frozenset(evals), frozenset({Path(a["checkpoint"]).name}), 1)
    plan = plan_gc(store, roots, "all", grace_s=0)
    assert {(k, key) for k, key, _ in plan.delete} == _listing(store) - before_b  # exactly run b's own artifacts
    assert plan.bytes == sum(store.size(k, key) for k, key, _ in plan.delete) > 0
    slim = plan_gc(store, roots, "last", grace_s=0)
    assert len(slim.drop_optimizer) == 3  # a's three intermediate checkpoints; its final keeps AdamW state
    assert plan_gc(store, roots, "all", grace_s=3600).delete == []  # everything is younger than the grace period
    with store.lock("run-b", [Path(b["checkpoint"]).name]):
        held = plan_gc(store, roots, "all", grace_s=0)
        assert ("checkpoint", Path(b["checkpoint"]).name) not in {(k, key) for k, key, _ in held.delete}
    n, freed = apply_gc(store, slim, started=__import__("time").time() + 1)
    assert n == len(slim.delete) + 3 and freed == slim.bytes
    assert _listing(store) == {(k, weights_only_key(key) if k == "checkpoint" and key != Path(a["checkpoint"]).name
                                else key) for k, key in before_b}
    assert store.verify_all()[1] == []
    again = run_inline(validate_config(_cfg(tmp_path, checkpoint_optimizer="all")))  # a rerun: nothing trains
    assert again["executed"].keys() <= {"evaluate"} and again["checkpoint"] == a["checkpoint"]


@pytest.mark.slow
def test_cli_gc_dry_run_then_yes_after_recorded_flow_runs(prefect_harness, tmp_path):
    """Two recorded flow runs and one untracked run in one data dir: `coopflow gc` lists bytes per kind and deletes
    nothing; `--yes` deletes exactly the untracked run's artifacts; `verify` passes and rerunning a recorded run
    finds its final checkpoint (nothing trains)."""
    from coopflow.flows.cli import main
    from coopflow.flows.train import train_magrpo

    cfg = small_config(tmp_path, checkpoint_every=1)
    first = train_magrpo(config=cfg)
    second = train_magrpo(config={**cfg, "seed": 1})
    store = ArtifactStore(tmp_path / "artifacts")
    recorded = _listing(store)
    run_inline(validate_config({**cfg, "seed": 2}))  # not tracked: nothing records it
    untracked = _listing(store) - recorded
    assert untracked

    lines: list[str] = []
    from coopflow.flows import gc as G

    assert G.gc(tmp_path, yes=False, grace_min=0, out=lines.append) == 0
    text = "\n".join(lines)
    assert "2 recorded run(s)" in text and "checkpoint" in text and "total to free" in text and "dry run" in text
    assert any(u in text for u in (" kB", " MB", " GB"))
    assert _listing(store) == recorded | untracked  # nothing deleted
    assert main(["gc", "--data-dir", str(tmp_path), "--yes", "--grace-minutes", "0"]) == 0
    assert _listing(store) == recorded
    assert main(["verify", "--data-dir", str(tmp_path)]) == 0
    for s in (first, second):
        assert find_checkpoint(store, s["run_key"]) is not None
    again = train_magrpo(config=cfg)
    assert again["segments_cached"] == [True] * len(again["segments_cached"])
    assert "generate" not in again["executed"] and "update" not in again["executed"]


def _written(store: ArtifactStore, before: set) -> int:
    return sum(store.size(k, key) for k, key in _listing(store) - before)


@pytest.mark.parametrize("keep", ["all", "last"])
def test_disk_estimate_is_within_a_sane_factor_of_what_a_tiny_run_writes(tmp_path, keep):
    """The pre-flight estimate (parameter count from the model's shape, no weights loaded) against the bytes the
    run's checkpoints and rollouts really take (models and the taskset, inputs, not counted)."""
    from coopflow.stages.operations.preflight import preflight

    cfg = validate_config(_cfg(tmp_path, checkpoint_optimizer=keep))
    est = preflight(cfg)
    store = ArtifactStore(tmp_path / "artifacts")
    before = _listing(store)
    run_inline(cfg)
    ckpt = sum(store.size("checkpoint", k) for _, k in store.artifacts("checkpoint"))
    total = _written(store, before | {x for x in _listing(store) if x[0] in ("model", "taskset")})
    assert est.checkpoints == 4
    assert 0.8 < est.checkpoint_bytes / ckpt < 1.25, (est, ckpt)
    assert 0.5 < est.total_bytes / total < 3, (est, total)


def test_model_size_reads_safetensors_headers(tiny_model_dir):
    from coopflow.stages.operations.preflight import _tiny_params, model_size

    cfg = validate_config(small_config(Path("/tmp")))
    params, per, other = model_size(str(tiny_model_dir), cfg)
    assert per == 4 and other > 0
    assert params == _tiny_params(64, 2)  # the header's count equals the shape's (what a 'tiny' source gets)
    assert model_size("no-such-org/no-such-model", cfg) is None


def test_a_run_that_does_not_fit_on_the_disk_is_refused_before_it_starts(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from coopflow.flows.cli import main
    from coopflow.stages.operations.preflight import PreflightError, preflight

    cfg = validate_config(_cfg(tmp_path))
    est = preflight(cfg)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - est.total_bytes // 2,
                                                            est.total_bytes // 2))
    with pytest.raises(PreflightError, match=r"this run writes up to .* but only .* is free there.*checkpoint_optimizer"):
        preflight(cfg)
    assert preflight(validate_config({**_cfg(tmp_path), "check_disk": False})) is not None
    import json

    cfg_file = tmp_path / "run.json"
    cfg_file.write_text(json.dumps(_cfg(tmp_path)))
    assert main(["run", "train-magrpo", "--config", str(cfg_file)]) == 2  # refused before Prefect starts
