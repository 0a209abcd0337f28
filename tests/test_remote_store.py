"""The artifact store mirrored to object storage (`remote_store`, issue 21): commits are published as an
immutable object set plus a commit record written last, another machine's store fetches and verifies them, a
writer killed before its record leaves nothing visible, corrupted objects are refused, and a run on a second
data dir reuses everything the first published. Fast tests use fsspec's in-memory filesystem; the slow one runs
two `coopflow run` processes against an S3 API on loopback (moto's server, s3fs)."""

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from coopflow.artifacts import ArtifactError, ArtifactStore
from coopflow.artifacts.store import PUBLISHED
from coopflow.schemas.config import ConfigError, validate_config
from coopflow.flows.driver import run_inline
from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def remote():
    """A fresh in-memory bucket (shared by every store in this process), emptied after the test."""
    import fsspec

    url = f"memory://coopflow-{uuid.uuid4().hex[:8]}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url.split("://")[1]):
        fs.rm(url.split("://")[1], recursive=True)


def _put(store: ArtifactStore):
    t = store.put_table("metrics", "k1", [{"key": "loss", "value": 1.5, "env_step": 0}])
    d = store.put_dir("checkpoint", "c1", lambda p: ((p / "agent_0").mkdir(), (p / "agent_0" / "w.bin").write_bytes(
        b"\x00\x01" * 1000), (p / "state.json").write_text("{}"), (p / ".gitattributes").write_text("*.bin lfs")))
    return t, d


def test_a_second_store_fetches_and_verifies_what_the_first_published(tmp_path, remote):
    a = ArtifactStore(tmp_path / "a", remote)
    t, d = _put(a)
    assert (a.location(t) / PUBLISHED).is_file() and (a.location(d) / PUBLISHED).is_file()
    b = ArtifactStore(tmp_path / "b", remote)
    assert b.find("metrics", "k1") == t and b.find("checkpoint", "c1") == d
    assert b.read_rows(t) == a.read_rows(t)
    assert (b.open_dir(d) / "agent_0" / "w.bin").read_bytes() == b"\x00\x01" * 1000
    assert (b.open_dir(d) / ".gitattributes").read_text() == "*.bin lfs"  # hidden files are artifact files too
    assert b.verify_all() == (2, [])
    # a ref handed over from another machine (never looked up here) is fetched on first read
    c = ArtifactStore(tmp_path / "c", remote)
    assert c.read_rows(t) == a.read_rows(t)
    assert sorted(a.remote.keys()) == [("checkpoint", "c1"), ("metrics", "k1")]


def test_a_fetch_that_loses_the_rename_to_a_concurrent_one_returns_its_artifact(tmp_path, remote, monkeypatch):
    """Two runs on one data dir that fetch the same published artifact at once (the clean-clone CI saw it: two
    `coopflow run` processes sharing a bucket): the second to rename its download into place finds the first one's
    there (ENOTEMPTY); it keeps that one and removes its own download instead of failing."""
    t, d = _put(ArtifactStore(tmp_path / "a", remote))
    b, other = ArtifactStore(tmp_path / "b", remote), ArtifactStore(tmp_path / "b", remote)
    replace, raced = os.replace, []

    def other_fetches_first(src, dst):
        if ".tmp-" in str(src) and not raced:
            raced.append(1)  # the other fetch lands in the window between the exists check and the rename
            other.find(*Path(dst).relative_to(b.root).parts)
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", other_fetches_first)
    for ref in (t, d):
        raced.clear()
        assert b.find(ref.kind, ref.key) == ref and raced
    assert b.read_rows(t) == [{"key": "loss", "value": 1.5, "env_step": 0}]
    assert b.verify_all() == (2, [])
    assert not list(b.root.rglob(".tmp-*"))


def test_a_writer_killed_before_its_commit_record_leaves_nothing_visible(tmp_path, remote, monkeypatch):
    """Objects uploaded, record not written (here: the record's PUT fails): other stores see no artifact; the
    writer's next lookup publishes it."""
    a = ArtifactStore(tmp_path / "a", remote)
    real = type(a.remote.fs).pipe_file
    monkeypatch.setattr(type(a.remote.fs), "pipe_file", lambda *args, **kw: (_ for _ in ()).throw(OSError("down")))
    with pytest.raises(ArtifactError, match="intact locally"):
        a.put_table("metrics", "k1", [{"key": "loss", "value": 1.5, "env_step": 0}])
    assert a.remote.fs.glob(f"{a.remote.root}/metrics/k1/*/data.parquet")  # the objects are there ...
    b = ArtifactStore(tmp_path / "b", remote)
    assert b.find("metrics", "k1") is None  # ... but nothing is visible without the record
    assert (a.path("metrics", "k1") / "ref.json").is_file() and not (a.path("metrics", "k1") / PUBLISHED).exists()
    with pytest.raises(ArtifactError, match="could not publish"):  # still down: each lookup retries, loudly
        a.find("metrics", "k1")
    monkeypatch.setattr(type(a.remote.fs), "pipe_file", real)
    ref = a.find("metrics", "k1")  # the remote is back: the lookup publishes the local artifact
    assert (a.path("metrics", "k1") / PUBLISHED).is_file()
    assert ArtifactStore(tmp_path / "c", remote).find("metrics", "k1") == ref


def test_corrupted_or_missing_remote_objects_are_refused_and_nothing_lands(tmp_path, remote):
    a = ArtifactStore(tmp_path / "a", remote)
    t, d = _put(a)
    fs, root = a.remote.fs, a.remote.root
    [obj] = fs.glob(f"{root}/checkpoint/c1/*/agent_0/w.bin")
    fs.pipe_file(obj, b"\x00\x02" * 1000)  # a flipped byte on the object store
    b = ArtifactStore(tmp_path / "b", remote)
    with pytest.raises(ArtifactError, match="downloaded copy does not verify .*agent_0/w.bin is corrupted: digest"):
        b.find("checkpoint", "c1")
    assert not b.path("checkpoint", "c1").exists() and not list((tmp_path / "b" / "checkpoint").glob(".tmp-*"))
    [data] = fs.glob(f"{root}/metrics/k1/*/data.parquet")
    fs.rm_file(data)
    with pytest.raises(ArtifactError, match="data.parquet of commit .* is missing"):
        b.find("metrics", "k1")
    fs.pipe_file(f"{root}/metrics/k1/commit.json", b"{not json")
    with pytest.raises(ArtifactError, match="commit record .* is corrupted"):
        b.find("metrics", "k1")
    assert a.read_rows(t)  # the writer's local copy is untouched


def test_the_last_commit_record_wins_and_never_mixes_writers(tmp_path, remote):
    """Two machines commit the same key: each record names its own complete object set."""
    a, b = ArtifactStore(tmp_path / "a", remote), ArtifactStore(tmp_path / "b", remote)
    mirror, b.remote = b.remote, None  # b computes the same stage before a's record is visible to it ...
    b.put_table("metrics", "k1", [{"key": "loss", "value": 2.0, "env_step": 0}])
    a.put_table("metrics", "k1", [{"key": "loss", "value": 1.0, "env_step": 0}])
    b.remote = mirror
    b.find("metrics", "k1")  # ... and publishes it after a did
    assert len(a.remote.fs.glob(f"{a.remote.root}/metrics/k1/*/data.parquet")) == 2
    c = ArtifactStore(tmp_path / "c", remote)
    assert c.read_rows(c.find("metrics", "k1"))[0]["value"] == 2.0


def test_remove_deletes_the_remote_copy_too(tmp_path, remote):
    a = ArtifactStore(tmp_path / "a", remote)
    t, _ = _put(a)
    assert a.remove("metrics", "k1")
    assert not a.remote.fs.exists(f"{a.remote.root}/metrics/k1")
    assert ArtifactStore(tmp_path / "b", remote).find("metrics", "k1") is None
    assert a.find("checkpoint", "c1") is not None


def test_remote_store_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a URL"):
        validate_config(small_config(tmp_path, remote_store="/mnt/bucket"))
    with pytest.raises(ConfigError, match="set remote_store: s3://b/p"):
        validate_config({**small_config(tmp_path), "data_dir": "s3://b/p"})
    cfg = validate_config(small_config(tmp_path, remote_store="nosuchfs://bucket/x"))
    with pytest.raises(ArtifactError, match="cannot open the nosuchfs:// filesystem"):
        ArtifactStore.of(cfg)


def test_a_run_on_a_second_data_dir_reuses_what_the_first_published(tmp_path, remote, pinned_threads):
    """Machine B (its own data dir, the same remote) runs the same config: no generation, no update; the same
    checkpoint key as a run without a remote, fetched and verified."""
    first = run_inline(validate_config(small_config(tmp_path / "a", remote_store=remote)))
    assert first["executed"].get("update", 0) >= 1
    second = run_inline(validate_config(small_config(tmp_path / "b", remote_store=remote)))
    assert not second["executed"].get("generate") and not second["executed"].get("update")
    assert second["reward_last"] == first["reward_last"] and second["eval"] == first["eval"]
    plain = run_inline(validate_config(small_config(tmp_path / "c")))
    assert Path(second["checkpoint"]).name == Path(first["checkpoint"]).name == Path(plain["checkpoint"]).name
    assert ArtifactStore(tmp_path / "b" / "artifacts").verify_all()[1] == []


# --- S3 over loopback: two `coopflow run` processes, one bucket ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(tmp_path):
    """An S3 API on 127.0.0.1 (moto's server) with one bucket; yields (endpoint, env)."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server", reason="the S3 test needs moto[server] (in the dev extra)")
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    log = open(tmp_path / "moto.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=log, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import s3fs

        deadline = time.time() + 60
        while True:
            try:
                s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test", skip_instance_cache=True
                                  ).mkdir("coopflow-runs")
                break
            except Exception:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        yield endpoint, env
    finally:
        proc.kill()
        proc.wait()
        log.close()


def _cli_run(cfg: dict, data: Path, env: dict, log: Path, **extra) -> int:
    cfg_file = data.with_suffix(".json")
    cfg_file.write_text(json.dumps(cfg))
    clean = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI",
                                                        "COOPFLOW_HOME", "COOPFLOW_FAULT")}
    with open(log, "a") as out:
        return subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config", str(cfg_file),
                               "--set", f"data_dir={data}", "--summary-json", str(data.with_suffix(".summary.json"))],
                              cwd=REPO, stdout=out, stderr=out, env={**clean, "OMP_NUM_THREADS": "1", **extra},
                              timeout=900).returncode


@pytest.mark.slow
def test_two_machines_share_one_s3_bucket(tmp_path, s3):
    """`coopflow run` on data dir A is SIGKILLed after uploading its checkpoint's objects but before the record;
    a run on data dir B (another machine) never sees that partial checkpoint, completes, and publishes; a run on
    data dir C then reuses everything from the bucket (nothing generated or updated) and verifies."""
    import s3fs

    endpoint, env = s3
    cfg = small_config(tmp_path, remote_store="s3://coopflow-runs/team", remote_store_options={"endpoint_url": endpoint})
    log = tmp_path / "cli.log"
    assert _cli_run(cfg, tmp_path / "a", env, log, COOPFLOW_FAULT="publish:checkpoint") == -9, log.read_text()[-3000:]
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test", skip_instance_cache=True)
    assert fs.glob("coopflow-runs/team/checkpoint/*/*/trainer_state.json") or \
        fs.glob("coopflow-runs/team/checkpoint/*/*/manifest.json")  # its objects were uploaded ...
    assert not fs.glob("coopflow-runs/team/checkpoint/*/commit.json")  # ... but no checkpoint was committed
    assert fs.glob("coopflow-runs/team/rollouts/*/commit.json")  # (the stages before it were)
    assert _cli_run(cfg, tmp_path / "b", env, log) == 0, log.read_text()[-3000:]
    b = json.loads((tmp_path / "b").with_suffix(".summary.json").read_text())
    assert not b["executed"].get("generate")  # B reused A's published rollouts
    fs.invalidate_cache()
    assert fs.glob("coopflow-runs/team/checkpoint/*/commit.json")
    assert _cli_run(cfg, tmp_path / "c", env, log) == 0, log.read_text()[-3000:]
    c = json.loads((tmp_path / "c").with_suffix(".summary.json").read_text())
    assert not c["executed"].get("generate") and not c["executed"].get("update")
    assert Path(c["checkpoint"]).name == Path(b["checkpoint"]).name and c["eval"] == b["eval"]
    assert ArtifactStore(tmp_path / "c" / "artifacts").verify_all()[1] == []
