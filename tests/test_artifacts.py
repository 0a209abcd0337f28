"""Artifact store: schema-checked tables, manifest-checked dirs, atomic writes, input-addressed keys."""

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
import xxhash

from coopflow.artifacts.store import (ArtifactError, ArtifactRef, ArtifactStore, StoreFullError, canonical_json, key_for,
                             sha256_file)
from coopflow.schemas.tables import SCHEMA_VERSION, TABLES, schema_for

METRICS = [{"key": "reward/mean", "value": 0.5, "env_step": 8},
           {"key": "reward/mean", "value": 0.75, "env_step": 16},
           {"key": None, "value": -1.0, "env_step": 24}]

ADV = [{"step": 0, "item_id": 3, "turn": 0, "node_id": 1, "agent": a, "sample": s, "return": float(a + s),
        "advantage": float(s) - 0.5} for a in range(2) for s in range(2)]


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


def _temp_dirs(store: ArtifactStore) -> list[Path]:
    return [p for kind in store.root.iterdir() for p in kind.glob(".tmp-*")]


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# --- tables ----------------------------------------------------------------------------------------


def test_put_read_table_round_trip_from_rows(store):
    ref = store.put_table("metrics", "k1", METRICS, meta={"run": "x"})
    assert isinstance(ref, ArtifactRef)
    assert (ref.kind, ref.key, ref.rows, ref.schema_version) == ("metrics", "k1", 3, SCHEMA_VERSION)
    assert store.location(ref) == store.path("metrics", "k1")
    assert ref.sha256 == sha256_file(store.location(ref) / "data.parquet")
    table = store.read_table(ref)
    assert table.schema.equals(schema_for("metrics"), check_metadata=False)
    assert table.to_pylist() == METRICS
    assert store.read_rows(ref) == METRICS
    md = table.schema.metadata
    assert md[b"coopflow_key"] == b"k1"
    assert json.loads(md[b"coopflow_meta"]) == {"run": "x"}
    assert md[b"artifact"] == b"metrics" and md[b"schema_version"] == SCHEMA_VERSION.encode()
    assert store.find("metrics", "k1") == ref


def test_put_table_from_arrow_table_reorders_and_casts(store):
    # columns out of order and with wider/narrower types than declared: cast to the schema
    t = pa.table({"advantage": [r["advantage"] for r in ADV], "return": [r["return"] for r in ADV],
                  "sample": pa.array([r["sample"] for r in ADV], pa.int64()),
                  "agent": pa.array([r["agent"] for r in ADV], pa.int64()),
                  "node_id": [r["node_id"] for r in ADV], "turn": pa.array([0] * 4, pa.int64()),
                  "item_id": pa.array([3] * 4, pa.int32()), "step": [0] * 4})
    ref = store.put_table("advantages", "a1", t)
    out = store.read_table(ref)
    assert out.schema.equals(TABLES["advantages"], check_metadata=False)
    assert out.column_names == TABLES["advantages"].names
    assert out.to_pylist() == ADV


def test_round_trip_list_columns(store):
    rows = [{"step": 0, "item_id": 1, "turn": 0, "node_id": 0, "joint_idx": 0, "combo": [0, 1],
             "reward_raw": 0.5, "reward": 50.0, "env_step": 1, "agent_rewards": [0.25, 0.75]}]
    ref = store.put_table("scores", "s1", rows)
    assert store.read_rows(ref) == rows


def test_wrong_columns_raise(store):
    missing = pa.table({"key": ["a"], "value": [1.0]})
    with pytest.raises(ArtifactError, match=r"missing \['env_step'\]"):
        store.put_table("metrics", "bad1", missing)
    extra = pa.table({"key": ["a"], "value": [1.0], "env_step": [1], "agent_0": [2.0]})
    with pytest.raises(ArtifactError, match=r"unexpected \['agent_0'\]"):
        store.put_table("metrics", "bad2", extra)
    uncastable = pa.table({"key": ["a"], "value": ["not a number"], "env_step": [1]})
    with pytest.raises(ArtifactError, match="cannot be cast"):
        store.put_table("metrics", "bad3", uncastable)
    for key in ("bad1", "bad2", "bad3"):
        assert store.find("metrics", key) is None
        assert not store.path("metrics", key).exists()


def test_unknown_kind_raises(store):
    with pytest.raises(KeyError, match="unknown artifact kind"):
        store.put_table("nonsense", "k", METRICS)


def test_corrupted_parquet_raises_naming_the_file(store):
    ref = store.put_table("metrics", "k1", METRICS)
    path = store.location(ref) / "data.parquet"
    _flip_byte(path)
    with pytest.raises(ArtifactError, match="corrupted") as err:
        store.read_table(ref)
    assert str(path) in str(err.value)


def test_missing_parquet_raises(store):
    ref = store.put_table("metrics", "k1", METRICS)
    path = store.location(ref) / "data.parquet"
    path.unlink()
    with pytest.raises(ArtifactError, match="missing") as err:
        store.read_table(ref)
    assert str(path) in str(err.value)


def test_schema_mismatch_on_read_raises(store):
    ref = store.put_table("metrics", "k1", METRICS)
    import shutil

    shutil.copytree(store.location(ref), store.path("eval", ref.key))  # a metrics table where an eval table belongs
    wrong = ArtifactRef(kind="eval", key=ref.key, uri=f"eval/{ref.key}", sha256=ref.sha256, rows=ref.rows)
    with pytest.raises(ArtifactError, match="does not match the declared eval schema"):
        store.read_table(wrong)


def test_put_existing_key_returns_existing_ref_without_overwriting(store):
    ref1 = store.put_table("metrics", "same", METRICS)
    mtime = (store.location(ref1) / "data.parquet").stat().st_mtime_ns
    ref2 = store.put_table("metrics", "same", METRICS[:1])
    assert ref2 == ref1
    assert ref2.rows == 3
    assert store.read_rows(ref2) == METRICS
    assert (store.location(ref1) / "data.parquet").stat().st_mtime_ns == mtime



def test_a_writer_that_loses_the_rename_to_a_concurrent_one_returns_its_artifact(store, monkeypatch):
    """Two runs (two processes) that compute the same artifact at once: the second to rename its temp dir into place
    finds the first one's there (ENOTEMPTY); it keeps that one and removes its own temp dir instead of failing."""
    import os

    other = ArtifactStore(store.root)
    replace, raced = os.replace, []

    def other_commits_first(src, dst):
        if not raced and ".tmp-" in str(src) and "-" + str(os.getpid()) + "-" in str(src):
            raced.append(1)  # the other writer commits in the window between the exists check and the rename
            other.put_table("metrics", "same", METRICS)
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", other_commits_first)
    ref = store.put_table("metrics", "same", METRICS)
    assert raced and ref == other.find("metrics", "same")
    assert store.read_rows(ref) == METRICS
    assert _temp_dirs(store) == []

# --- directories -----------------------------------------------------------------------------------


def _writer(d: Path) -> None:
    (d / "config.json").write_text('{"a": 1}')
    (d / "sub").mkdir()
    (d / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 4)


def test_put_open_dir_with_manifest(store):
    ref = store.put_dir("checkpoint", "c1", _writer)
    assert ref.kind == "checkpoint" and ref.rows is None
    root = store.open_dir(ref)
    assert root == store.location(ref)
    assert (root / "config.json").read_text() == '{"a": 1}'
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["kind"] == "checkpoint" and manifest["key"] == "c1"
    xxh3 = {rel: "xxh3-128:" + xxhash.xxh3_128((root / rel).read_bytes()).hexdigest()
            for rel in ("config.json", "sub/weights.bin")}
    assert manifest["files"] == xxh3
    assert ref.sha256 == hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()


def test_a_commit_is_on_the_disk_before_its_key_is_recorded(store, monkeypatch):
    """Every file and directory of an artifact is fsync'd before the rename that records its key, and the rename is
    flushed after: a machine that goes down leaves the whole artifact or none of it (tables and directories)."""
    import os

    from coopflow.artifacts import store as S

    events, fsync, replace = [], S._fsync, os.replace
    monkeypatch.setattr(S, "_fsync", lambda p: (events.append(("fsync", Path(p))), fsync(p)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("rename", Path(b))), replace(a, b)))
    for put in (lambda: store.put_dir("checkpoint", "durable", _writer),
                lambda: store.put_table("metrics", "durable", METRICS)):
        events.clear()
        ref = put()
        final = store.location(ref)
        renames = [i for i, (what, _) in enumerate(events) if what == "rename"]
        assert len(renames) == 1 and events[renames[0]][1] == final
        before = [p for what, p in events[:renames[0]] if what == "fsync"]
        tmp = before[-1]  # the temp dir itself, flushed last (its entries after its files)
        assert tmp.name.startswith(".tmp-") and tmp.parent == final.parent
        flushed = {str(p.relative_to(tmp)) for p in before}
        assert flushed == {str(p.relative_to(final)) for p in final.rglob("*")} | {"."}
        assert events[renames[0] + 1:] == [("fsync", final.parent)]  # the rename itself


def test_a_filesystem_that_cannot_flush_still_commits_and_a_failed_flush_stores_nothing(store, monkeypatch):
    """fsync refused by the filesystem (EINVAL: some network and FUSE mounts) is no error; a flush that fails (EIO)
    fails the commit and leaves no artifact and no temp dir."""
    import errno
    import os

    def refuse(fd, code):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", lambda fd: refuse(fd, errno.EINVAL))
    ref = store.put_table("metrics", "no-flush", METRICS)
    assert store.read_rows(ref) == METRICS
    monkeypatch.setattr(os, "fsync", lambda fd: refuse(fd, errno.EIO))
    with pytest.raises(OSError, match="Input/output error"):
        store.put_dir("checkpoint", "lost", _writer)
    assert store.find("checkpoint", "lost") is None and _temp_dirs(store) == []


def test_a_manifest_of_sha256_digests_still_verifies_and_catches_corruption(store):
    """Manifests written before the XXH3 digests (and writers that hash their own files with sha256) record bare
    sha256 hex: such a directory still opens, and a flipped byte in it is still caught, naming the file."""
    def writer(d: Path) -> dict[str, str]:
        _writer(d)
        return {rel: sha256_file(d / rel) for rel in ("config.json", "sub/weights.bin")}

    ref = store.put_dir("checkpoint", "old", writer)
    root = store.open_dir(ref)
    files = json.loads((root / "manifest.json").read_text())["files"]
    assert files["sub/weights.bin"] == hashlib.sha256((root / "sub" / "weights.bin").read_bytes()).hexdigest()
    _flip_byte(root / "sub" / "weights.bin", 3)
    with pytest.raises(ArtifactError, match="corrupted") as err:
        store.open_dir(ref)
    assert str(root / "sub" / "weights.bin") in str(err.value)


def test_corrupted_dir_file_raises_naming_it(store):
    ref = store.put_dir("checkpoint", "c1", _writer)
    bad = store.location(ref) / "sub" / "weights.bin"
    _flip_byte(bad, 10)
    with pytest.raises(ArtifactError, match="corrupted") as err:
        store.open_dir(ref)
    assert str(bad) in str(err.value)


def test_missing_dir_file_raises_naming_it(store):
    ref = store.put_dir("checkpoint", "c1", _writer)
    gone = store.location(ref) / "config.json"
    gone.unlink()
    with pytest.raises(ArtifactError, match="missing") as err:
        store.open_dir(ref)
    assert str(gone) in str(err.value)


def test_corrupted_manifest_raises(store):
    ref = store.put_dir("checkpoint", "c1", _writer)
    m = store.location(ref) / "manifest.json"
    m.write_text(m.read_text().replace('"c1"', '"c2"'))
    with pytest.raises(ArtifactError, match="manifest"):
        store.open_dir(ref)


def test_put_dir_existing_key_does_not_call_writer(store):
    ref1 = store.put_dir("checkpoint", "c1", _writer)
    called = []
    ref2 = store.put_dir("checkpoint", "c1", lambda d: called.append(d))
    assert ref2 == ref1 and called == []
    assert store.open_dir(ref2) == store.location(ref1)


def test_failing_writer_leaves_nothing(store):
    def writer(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x" * 100)
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        store.put_dir("checkpoint", "c1", writer)
    assert store.find("checkpoint", "c1") is None
    assert not store.path("checkpoint", "c1").exists()
    assert _temp_dirs(store) == []
    # and the key can still be written afterwards
    assert store.open_dir(store.put_dir("checkpoint", "c1", _writer)).is_dir()


def test_json_round_trip(store):
    ref = store.put_json("model", "j1", {"b": [1, 2], "a": "x"})
    assert store.read_json(ref) == {"a": "x", "b": [1, 2]}


def test_stale_incomplete_dir_is_replaced(store):
    stale = store.path("checkpoint", "c1")
    stale.mkdir(parents=True)
    (stale / "junk").write_text("half written, no ref.json")
    assert store.find("checkpoint", "c1") is None
    ref = store.put_dir("checkpoint", "c1", _writer)
    root = store.open_dir(ref)
    assert not (root / "junk").exists()


# --- keys, remove ----------------------------------------------------------------------------------


def test_key_for_stable_and_order_insensitive():
    k = key_for("rollouts", {"a": 1, "b": {"x": [1, 2], "y": None}})
    assert len(k) == 24 and all(c in "0123456789abcdef" for c in k)
    assert k == key_for("rollouts", {"b": {"y": None, "x": [1, 2]}, "a": 1})
    payload = json.dumps({"kind": "rollouts", "schema_version": SCHEMA_VERSION,
                          "inputs": {"a": 1, "b": {"x": [1, 2], "y": None}}}, sort_keys=True, separators=(",", ":"))
    assert k == hashlib.sha256(payload.encode()).hexdigest()[:24]
    assert k != key_for("scores", {"a": 1, "b": {"x": [1, 2], "y": None}})
    assert k != key_for("rollouts", {"a": 2, "b": {"x": [1, 2], "y": None}})
    assert k != key_for("rollouts", {"a": 1, "b": {"x": [2, 1], "y": None}})  # lists keep order


def test_key_for_paths_and_models():
    assert key_for("k", {"p": Path("/a/b")}) == key_for("k", {"p": "/a/b"})
    ref = ArtifactRef(kind="metrics", key="x", uri="/u", sha256="0" * 64, rows=1)
    assert key_for("k", {"r": ref}) == key_for("k", {"r": ref.model_dump(mode="json")})
    with pytest.raises(TypeError, match="cannot hash"):
        key_for("k", {"o": object()})
    assert canonical_json({"b": 1, "a": 2}) == '{"a":2,"b":1}'


def test_remove(store):
    ref = store.put_table("metrics", "k1", METRICS)
    assert store.remove("metrics", "k1") is True
    assert store.find("metrics", "k1") is None
    assert not store.location(ref).exists()
    assert _temp_dirs(store) == []
    assert store.remove("metrics", "k1") is False
    # the key can be written again with new content
    ref2 = store.put_table("metrics", "k1", METRICS[:1])
    assert store.read_rows(ref2) == METRICS[:1]


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device"),
    RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),  # safetensors' words
    OSError(122, "Disk quota exceeded"),
])
def test_a_write_that_runs_out_of_space_says_so_and_leaves_nothing(store, failure):
    """Out of space mid-write: StoreFullError (an ArtifactError, so never retried) naming the store and the kind;
    the partial temp dir is removed; other failures pass through unchanged."""
    def writer(d: Path) -> None:
        (d / "half.bin").write_bytes(b"x" * 100)
        raise failure

    with pytest.raises(StoreFullError, match=r"no space left under .* while writing a checkpoint artifact"):
        store.put_dir("checkpoint", "k1", writer)
    assert store.find("checkpoint", "k1") is None
    assert not list(store.root.rglob(".tmp-*"))
    with pytest.raises(ValueError, match="other"):
        store.put_dir("checkpoint", "k2", lambda d: (_ for _ in ()).throw(ValueError("other")))
    assert not list(store.root.rglob(".tmp-*"))


def test_clean_temp(store):
    """Temp dirs of dead writers go; a live process's write in progress stays (another run may be writing);
    an old-format temp dir without a process id goes once it is stale."""
    import os
    import subprocess
    import sys

    store.put_table("metrics", "k1", METRICS)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    for name in (f".tmp-k2-{dead}-deadbeef", f".tmp-k3-{os.getpid()}-cafecafe", ".tmp-k4-0badf00d"):
        (store.root / "metrics" / name).mkdir()
        (store.root / "metrics" / name / "data.parquet").write_bytes(b"partial")
    assert store.clean_temp() == 1  # the dead writer's
    assert sorted(p.name for p in _temp_dirs(store)) == [".tmp-k3-%d-cafecafe" % os.getpid(), ".tmp-k4-0badf00d"]
    old = store.root / "metrics" / ".tmp-k4-0badf00d"
    os.utime(old, (0, 0))
    assert store.clean_temp() == 1 and not old.exists()  # stale: an older crash's leftover
    assert (store.root / "metrics" / f".tmp-k3-{os.getpid()}-cafecafe").is_dir()
    assert store.find("metrics", "k1") is not None


def test_copied_and_moved_data_dirs_read_their_own_files(tmp_path):
    """Refs resolve against the store root: a copy reads (and verifies) its own files, a moved store works."""
    import shutil

    a = ArtifactStore(tmp_path / "a")
    ref = a.put_table("metrics", "k1", METRICS)
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copy = ArtifactStore(tmp_path / "copy")
    (copy.location(ref) / "data.parquet").write_bytes(b"corrupted in the copy only")
    with pytest.raises(ArtifactError, match="corrupted"):
        copy.read_rows(copy.find("metrics", "k1"))
    assert a.read_rows(ref) == METRICS  # the original is untouched and still verifies
    shutil.move(str(tmp_path / "a"), str(tmp_path / "moved"))
    moved = ArtifactStore(tmp_path / "moved")
    assert moved.read_rows(moved.find("metrics", "k1")) == METRICS


def test_corrupted_ref_record_raises_artifact_error(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = store.put_json("model", "k1", {"a": 1})
    (store.location(ref) / "ref.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="ref.json is corrupted"):
        store.find("model", "k1")


# --- files created from a cached template (the MLflow DB)

def test_create_from_template_builds_once_and_never_touches_an_existing_target(tmp_path):
    from coopflow.artifacts.templates import create_from_template

    built = []

    def build(p):
        built.append(p)
        p.write_text("template v1")

    tpl = tmp_path / "cache" / "t.db"
    assert create_from_template(tmp_path / "a" / "x.db", tpl, build)
    assert create_from_template(tmp_path / "b" / "x.db", tpl, build, adapt=lambda p: p.write_text(p.read_text() + "+b"))
    assert len(built) == 1 and (tmp_path / "b" / "x.db").read_text() == "template v1+b"
    assert tpl.read_text() == "template v1"  # adapt edits the copy only
    (tmp_path / "a" / "x.db").write_text("my runs")
    assert not create_from_template(tmp_path / "a" / "x.db", tpl, build)
    assert (tmp_path / "a" / "x.db").read_text() == "my runs"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.db"]  # no temp files left


def test_failing_template_build_leaves_no_template_and_no_target(tmp_path):
    from coopflow.artifacts.templates import create_from_template

    def build(p):
        p.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        create_from_template(tmp_path / "x.db", tmp_path / "cache" / "t.db", build)
    assert not (tmp_path / "x.db").exists() and list((tmp_path / "cache").iterdir()) == []


def test_new_mlflow_db_is_a_migrated_copy_with_artifacts_under_the_data_dir(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.tracking import tracker_for
    from coopflow.schemas.config import validate_config

    monkeypatch.setenv("COOPFLOW_CACHE", str(tmp_path / "cache"))
    for name in ("one", "two"):
        cfg = validate_config({"data_dir": str(tmp_path / name), "trainer": {"num_turns": 1}})
        t = tracker_for(cfg)
        run_id = t.start("r", {}, {"a": 1})
        t.log_files({"x.json": {"a": 1}})
        t.finish(True)
        client = MlflowClient(f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        assert client.get_run(run_id).info.artifact_uri.startswith((tmp_path / name / "mlartifacts").as_uri())
        assert (tmp_path / name / "mlartifacts" / "coopflow" / run_id / "artifacts" / "x.json").is_file()
        assert client.get_experiment("0").artifact_location == (tmp_path / name / "mlartifacts" / "Default").as_uri()
    assert len(list((tmp_path / "cache").glob("mlflow-*-empty.db"))) == 1
    # an existing DB is reused as it is: the first run is still there
    again = tracker_for(validate_config({"data_dir": str(tmp_path / "one"), "trainer": {"num_turns": 1}}))
    assert again.client.search_runs([again.experiment_id])[0].info.run_id


def test_verify_all_finds_every_bad_artifact_and_quarantine_sets_them_aside(tmp_path):
    """One pass reports every corrupted or incomplete artifact (not one per rerun); quarantined ones are kept
    aside and no longer found, so the stage that made them recomputes them."""
    import json as _json

    store = ArtifactStore(tmp_path / "artifacts")
    good = store.put_table("metrics", "good", METRICS)
    bad_table = store.put_table("metrics", "bad", METRICS)
    (store.location(bad_table) / "data.parquet").write_bytes(b"flipped")
    d = store.put_json("drift", "d1", {"a": 1})
    (store.location(d) / "data.json").write_text(_json.dumps({"a": 2}))
    (store.path("metrics", "half")).mkdir()  # an incomplete write from an older crash (no ref.json)
    checked, bad = store.verify_all()
    assert checked == 4 and sorted((k, key) for k, key, _ in bad) == [("drift", "d1"), ("metrics", "bad"),
                                                                     ("metrics", "half")]
    for kind, key, _ in bad:
        moved = store.quarantine(kind, key)
        assert moved.is_dir() and ".quarantine" in str(moved)
    assert store.find("metrics", "bad") is None and store.read_rows(good) == METRICS
    assert store.verify_all() == (1, [])


def test_cli_verify_reports_and_quarantines(tmp_path):
    import subprocess
    import sys

    store = ArtifactStore(tmp_path / "artifacts")
    ref = store.put_table("metrics", "bad", METRICS)
    (store.location(ref) / "data.parquet").write_bytes(b"flipped")
    repo = Path(__file__).resolve().parents[1]

    def verify(*extra):
        return subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "verify", "--data-dir", str(tmp_path), *extra],
                              cwd=repo, capture_output=True, text=True, timeout=120)

    r = verify()
    assert r.returncode == 1 and "BAD metrics/bad" in r.stdout and "1 artifacts checked, 1 bad" in r.stdout
    r = verify("--quarantine")
    assert r.returncode == 0 and "moved to" in r.stdout
    assert verify().stdout.strip().endswith("0 artifacts checked, 0 bad")


def _lock_holder(store: ArtifactStore, seconds: float):
    """A process that takes the store's 'run-k' lock, says 'held', and keeps it for `seconds`."""
    import subprocess
    import sys

    script = ("import sys, time; sys.path.insert(0, %r)\n"
              "from coopflow.artifacts import ArtifactStore\n"
              "l = ArtifactStore(%r).lock('run-k'); l.__enter__(); print('held', flush=True); time.sleep(%r)"
              % (str(Path(__file__).resolve().parents[1]), str(store.root), seconds))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_run_lock_serializes_and_a_dead_holder_releases_it(tmp_path):
    """Two runs of one run key: the second waits for the first; a holder killed with SIGKILL releases the lock."""
    import signal
    import time

    store = ArtifactStore(tmp_path / "artifacts")
    holder = _lock_holder(store, 1.5)
    assert holder.stdout.readline().strip() == "held"
    t0 = time.perf_counter()
    with store.lock("run-k") as waited:
        assert waited and time.perf_counter() - t0 > 0.5  # it waited for the holder to finish
    holder.wait(10)
    killed = _lock_holder(store, 60)
    assert killed.stdout.readline().strip() == "held"
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    t0 = time.perf_counter()
    with store.lock("run-k") as waited:
        assert time.perf_counter() - t0 < 5  # the dead holder's lock is gone
    with store.lock("run-k") as waited:
        assert not waited
