"""Content-checked, input-addressed artifact store: the only code in coopflow that touches disk.

Layout: `<root>/<kind>/<key>/` holding either `data.parquet` (table kinds) or a directory tree
(checkpoints, models), plus `ref.json` (the `ArtifactRef`) and, for directories, `manifest.json`
(a content digest of every file, `file_digest`). The key is computed from the *inputs* (`key_for`), so a
flow knows whether a stage is cached before running it; the digest of the *output* is verified on every
read: a table's data file and a directory's manifest by sha256 (the ref's `sha256`), a directory's files
by the digest its manifest records.

Writes are atomic and durable: everything goes to a hidden temp dir beside the target, is flushed to the disk
(every file and directory fsync'd) and renamed into place in one step, the rename flushed too. A killed process
never leaves a half-written artifact that looks complete, and neither does a machine that goes down: a key is
recorded only once its bytes are on the disk. An existing artifact is never overwritten.

With a remote (`remote_store`: object storage through fsspec, see `artifacts.remote`) the local store
is the working cache: each commit is also published there, and an artifact missing here is fetched
from there, verified, and renamed into place like a local write.
"""

import errno
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pydantic import BaseModel, ConfigDict

from coopflow.artifacts.faults import hit as fault_point
from coopflow.schemas.tables import SCHEMA_VERSION, schema_for


class ArtifactError(RuntimeError):
    """An artifact is missing, corrupted or does not match its declared schema."""


class StoreFullError(ArtifactError):
    """The disk (or quota) under the store ran out while writing an artifact; nothing stored was changed."""


_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _out_of_space(err: BaseException) -> bool:
    """A write failed for lack of space (OSError, or a library error wrapping one, e.g. safetensors')."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in _OUT_OF_SPACE:
            return True
        text = str(err)
        if "No space left on device" in text or "Disk quota exceeded" in text or "os error 28" in text:
            return True
        if "inline_container" in text and "unexpected pos" in text:  # torch.save's zip writer: a short write
            return True
        err = err.__cause__ or err.__context__
    return False


class ArtifactRef(BaseModel):
    """A pointer to one stored artifact; the only thing passed between tasks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    key: str
    uri: str  # "<kind>/<key>", relative to the store root (older stores recorded an absolute path; never read)
    sha256: str
    rows: int | None = None
    schema_version: str = SCHEMA_VERSION


def canonical_json(obj: Any) -> str:
    """Deterministic JSON used for hashing configs and inputs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return o.model_dump(mode="json")
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot hash object of type {type(o).__name__}")


def key_for(kind: str, inputs: dict[str, Any]) -> str:
    """Input-addressed key: sha256 of (kind, schema version, canonical inputs), 24 hex chars."""
    payload = canonical_json({"kind": kind, "schema_version": SCHEMA_VERSION, "inputs": inputs})
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _digests(root: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """`file_digest` of every file under `root` by relative path, hashed side by side (the hashers release the
    GIL: a checkpoint's few large files hash ~2x faster on two cores); `known` digests (hashed by whoever wrote
    those files) are taken as given, their files only checked to be there."""
    known = dict(known or {})
    files = sorted(p for p in root.rglob("*") if p.is_file())
    rels = {str(p.relative_to(root)) for p in files}
    missing = sorted(set(known) - rels)
    if missing:
        raise ArtifactError(f"files {missing} were hashed by their writer but are not under {root}")
    todo = [p for p in files if str(p.relative_to(root)) not in known]
    with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1, len(todo) or 1))) as pool:
        known.update({str(p.relative_to(root)): d for p, d in zip(todo, pool.map(file_digest, todo))})
    return dict(sorted(known.items()))


def _hash_file(h, path: Path, chunk: int = 1 << 20):
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes."""
    return _hash_file(hashlib.sha256(), path, chunk).hexdigest()


XXH3 = "xxh3-128:"  # the prefix of a file digest by xxHash's XXH3, 128 bits


def file_digest(path: Path) -> str:
    """The content digest a directory artifact's manifest records per file: 'xxh3-128:<32 hex>' (xxHash's XXH3,
    128 bits). It catches what a manifest is for — a flipped bit, a truncated, missing or swapped file — at
    ~10 GB/s on one core, where sha256 runs at ~1.7: a checkpoint's 1.6 GB per agent hashes in ~0.15 s instead
    of ~1 s, when written and on every verified read. (Not a defence against tampering, which sha256 would not
    be either: whoever can rewrite a file can rewrite the manifest beside it.)"""
    return XXH3 + _hash_file(xxhash.xxh3_128(), path).hexdigest()


def digest_matches(path: Path, recorded: str) -> tuple[bool, str]:
    """(whether `path` has the recorded digest, its digest in the recorded one's form): 'xxh3-128:…' as
    `file_digest` writes, or a bare hex sha256 (manifests written before, and writers that hash their own files
    with sha256)."""
    got = file_digest(path) if recorded.startswith(XXH3) else sha256_file(path)
    return got == recorded, got


_CANNOT_FLUSH = (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.ENOSYS)


def _fsync(path: Path) -> None:
    """Flush one file's (or directory's entries') written bytes to the disk. A filesystem that cannot flush this way
    (some network and FUSE mounts refuse fsync, or fsync of a directory) is left as it is; a failed flush (EIO, a
    full disk) raises."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _CANNOT_FLUSH:
            raise
    finally:
        os.close(fd)


def sync_files(files: list[Path]) -> None:
    """Flush these files' written bytes to the disk, side by side (fsync waits on the device and releases the GIL).
    A writer that flushes its own files as it finishes them (a checkpoint's agent on its writer thread) takes that
    wait off the commit; flushing a file again once it is clean costs next to nothing."""
    if files:
        with ThreadPoolExecutor(max(1, min(4, len(files)))) as pool:
            list(pool.map(_fsync, files))


def sync_tree(root: Path) -> None:
    """Flush every file under `root` to the disk (`sync_files`), then every directory, deepest first: after this, a
    crash of the machine cannot lose what `root` holds."""
    entries = list(root.rglob("*"))
    sync_files([p for p in entries if p.is_file()])
    for d in sorted([root, *(p for p in entries if p.is_dir())], key=lambda d: len(d.parts), reverse=True):
        _fsync(d)


PUBLISHED = ".published"  # in a local artifact dir: its remote copy is committed (not part of the artifact)


class ArtifactStore:
    """Artifacts under one root directory (mirrored to `remote`, an fsspec URL, when given)."""

    def __init__(self, root: str | os.PathLike, remote: str | None = None, remote_options: dict | None = None):
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._behind: dict[tuple[str, str], PendingDir] = {}  # writes in flight (put_dir_behind), by (kind, key)
        self.remote = None
        if remote:
            from coopflow.artifacts.remote import RemoteError, RemoteMirror

            try:
                self.remote = RemoteMirror(remote, remote_options)
            except RemoteError as err:
                raise ArtifactError(str(err)) from None

    @classmethod
    def of(cls, cfg) -> "ArtifactStore":
        """The store of a run config: `<data_dir>/artifacts`, mirrored to its `remote_store` (else
        $COOPFLOW_REMOTE_STORE) when set. Every run, whatever started it, opens its store here."""
        return cls.at(cfg.resolved_data_dir(), cfg)

    @classmethod
    def at(cls, data_dir: str | os.PathLike, cfg=None) -> "ArtifactStore":
        """The store under a data dir, `<data_dir>/artifacts`: mirrored as `cfg` says when a run config is given,
        local only without one (maintenance on one machine's cache: verify, gc, the model catalog)."""
        if cfg is None:
            return cls(Path(data_dir) / "artifacts")
        return cls(Path(data_dir) / "artifacts", cfg.resolved_remote_store(), cfg.remote_store_options)

    # --- lookup ----------------------------------------------------------------------------------

    def path(self, kind: str, key: str) -> Path:
        """Directory of an artifact (whether or not it exists)."""
        return self.root / kind / key

    def location(self, ref: ArtifactRef) -> Path:
        """Where a ref's files are in *this* store: refs resolve against the store root, never an absolute path
        they were recorded with, so a copied data dir reads (and verifies) its own files and a moved one works."""
        return self.path(ref.kind, ref.key)

    def find(self, kind: str, key: str) -> ArtifactRef | None:
        """The ref of a completed artifact (fetched from the remote when only it has it), or None. An artifact still
        being written here (`put_dir_behind`) is waited for and committed first."""
        if (kind, key) in self._behind:
            return self._behind[(kind, key)].result()
        ref_file = self.path(kind, key) / "ref.json"
        if not ref_file.is_file():
            return self._fetch(kind, key) if self.remote is not None else None
        try:
            ref = ArtifactRef.model_validate_json(ref_file.read_text())
        except ValueError as err:
            raise ArtifactError(f"artifact record {ref_file} is corrupted ({err.__class__.__name__}); "
                                f"delete {ref_file.parent} to recompute it") from None
        if self.remote is not None and not (ref_file.parent / PUBLISHED).is_file():
            self._publish(ref)  # committed here while the remote was unreachable (or before it was configured)
        return ref

    def _local(self, ref: ArtifactRef) -> Path:
        """Where a ref's files are here, fetching them from the remote first when only it has them."""
        root = self.location(ref)
        if self.remote is not None and not (root / "ref.json").is_file():
            self.find(ref.kind, ref.key)
        return root

    # --- tables ----------------------------------------------------------------------------------

    def put_table(self, kind: str, key: str, table: pa.Table | list[dict], meta: dict | None = None) -> ArtifactRef:
        """Write a table of a declared kind (validated and cast to its schema) atomically."""
        existing = self.find(kind, key)
        if existing is not None:
            return existing
        schema = schema_for(kind)
        if isinstance(table, list):
            table = pa.Table.from_pylist(table, schema=schema)
        else:
            table = self._conform(kind, table, schema)
        md = dict(schema.metadata or {})
        md[b"coopflow_key"] = key.encode()
        if meta:
            md[b"coopflow_meta"] = canonical_json(meta).encode()
        table = table.replace_schema_metadata(md)

        def write(tmp: Path) -> None:
            pq.write_table(table, tmp / "data.parquet")

        return self._commit(kind, key, write, rows=table.num_rows, table=True)

    def read_table(self, ref: ArtifactRef) -> pa.Table:
        """Read a table artifact, verifying its sha256 and schema."""
        path = self._local(ref) / "data.parquet"
        self._check_files(path.parent, ref, table=True)
        table = pq.read_table(path)
        expected = schema_for(ref.kind)
        if not table.schema.equals(expected, check_metadata=False):
            raise ArtifactError(f"artifact {path} does not match the declared {ref.kind} schema "
                                f"(schema_version {ref.schema_version}, expected {SCHEMA_VERSION})")
        return table

    def table_meta(self, ref: ArtifactRef) -> dict:
        """The `meta` a table artifact was written with (`put_table`), from its file's schema alone: no rows read."""
        raw = (pq.read_schema(self._local(ref) / "data.parquet").metadata or {}).get(b"coopflow_meta")
        return json.loads(raw) if raw else {}

    def read_rows(self, ref: ArtifactRef) -> list[dict]:
        """Table artifact as a list of row dicts."""
        return self.read_table(ref).to_pylist()

    @staticmethod
    def _conform(kind: str, table: pa.Table, schema: pa.Schema) -> pa.Table:
        missing = [n for n in schema.names if n not in table.column_names]
        extra = [n for n in table.column_names if n not in schema.names]
        if missing or extra:
            raise ArtifactError(f"{kind} table columns do not match its schema: missing {missing}, unexpected {extra}")
        try:
            return table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ArtifactError(f"{kind} table cannot be cast to its schema: {err}") from None

    # --- directories (checkpoints, models, JSON blobs) --------------------------------------------

    def put_dir(self, kind: str, key: str, writer: Callable[[Path], dict[str, str] | None]) -> ArtifactRef:
        """Let `writer` fill a temp dir, then record a manifest of file digests and commit atomically (`writer` may
        return the digests of files it wrote, by relative path (`file_digest`, or sha256): those are not read again)."""
        existing = self.find(kind, key)
        if existing is not None:
            return existing
        return self._commit(kind, key, writer, rows=None, table=False)

    def put_dir_behind(self, kind: str, key: str,
                       start: Callable[[Path], Callable[[], dict[str, str]]]) -> "ArtifactRef | PendingDir":
        """`put_dir` whose files are still being written when it returns (a checkpoint written while the next phase
        runs). `start(tmp)` begins filling the temp dir and returns `finish()`, which waits for the writes and
        returns the digests of the files it wrote (by relative path; any other file is hashed at commit); an `ended`
        attribute of `finish` (time.time()) says when those writes ended, else the commit time counts.

        Returns a `PendingDir`: `result()` (or any `find` of this kind and key here) waits for `finish`, then
        commits as `put_dir` does; the key is recorded only then, so a process killed before leaves only a temp dir,
        never an artifact. One write is in flight per store: an earlier one is committed first (a bounded queue)."""
        existing = self.find(kind, key)
        if existing is not None:
            return existing
        self.settle()
        tmp = self._temp_dir(kind, key)
        try:
            finish = start(tmp)
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            self._raise_if_full(err, kind)
            raise
        pending = PendingDir(self, kind, key, tmp, finish)
        self._behind[(kind, key)] = pending
        return pending

    def settle(self) -> float:
        """Commit every write still in flight here (`put_dir_behind`); returns the seconds this waited. A failed
        write raises its error (its temp dir removed, nothing recorded)."""
        waited = 0.0
        while self._behind:
            pending = next(iter(self._behind.values()))
            waited += pending.wait()
            pending.result()  # (raises a failed write's error)
        return waited

    def open_dir(self, ref: ArtifactRef, verify: bool = True) -> Path:
        """Directory of a dir artifact after verifying every file against its manifest (`verify=False`: only
        where it is, fetched from the remote when needed, for a caller that names it without reading it)."""
        root = self._local(ref)
        if verify:
            self._check_files(root, ref, table=False)
        return root

    @staticmethod
    def _check_files(root: Path, ref: ArtifactRef, table: bool) -> None:
        """Verify an artifact's files in `root` against its ref: a table's data.parquet against the ref's sha256;
        a directory's manifest against it, and every file the manifest lists against the manifest."""
        if table:
            path = root / "data.parquet"
            if not path.is_file():
                raise ArtifactError(f"artifact {ref.kind}/{ref.key} is missing its data file {path}")
            digest = sha256_file(path)
            if digest != ref.sha256:
                raise ArtifactError(f"artifact file {path} is corrupted: sha256 {digest[:16]}… does not match the "
                                    f"recorded {ref.sha256[:16]}…; delete {root} to recompute it")
            return
        manifest_path = root / "manifest.json"
        if not manifest_path.is_file():
            raise ArtifactError(f"artifact {ref.kind}/{ref.key} is missing its manifest {manifest_path}")
        if sha256_file(manifest_path) != ref.sha256:
            raise ArtifactError(f"artifact manifest {manifest_path} is corrupted (sha256 mismatch)")
        for rel, digest in json.loads(manifest_path.read_text())["files"].items():
            f = root / rel
            if not f.is_file():
                raise ArtifactError(f"artifact file {f} is missing (listed in {manifest_path})")
            ok, got = digest_matches(f, digest)
            if not ok:
                raise ArtifactError(f"artifact file {f} is corrupted: digest {got[:25]}… does not match the "
                                    f"manifest's {digest[:25]}…; delete {root} to recompute it")

    def put_json(self, kind: str, key: str, obj: Any) -> ArtifactRef:
        """A small JSON document as a dir artifact (`data.json`)."""
        return self.put_dir(kind, key, lambda d: (d / "data.json").write_text(canonical_json(obj)))

    def read_json(self, ref: ArtifactRef) -> Any:
        """Read a JSON dir artifact after verification."""
        return json.loads((self.open_dir(ref) / "data.json").read_text())

    # --- commit ----------------------------------------------------------------------------------

    def _temp_dir(self, kind: str, key: str) -> Path:
        """A fresh hidden temp dir beside where artifact `kind/key` goes (renamed into place by a commit)."""
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def _commit(self, kind: str, key: str, writer: Callable[[Path], None], rows: int | None,
                table: bool, digests: dict[str, str] | None = None, tmp: Path | None = None) -> ArtifactRef:
        """Fill a temp dir with `writer` (or take `tmp`, already filled), record its digests and rename it into place;
        `digests`: every file's digest (a directory), or some of them (`tmp`: the rest are hashed here)."""
        final = self.path(kind, key)
        tmp = tmp if tmp is not None else self._temp_dir(kind, key)
        try:
            hashed = writer(tmp)
            if table:
                digest = sha256_file(tmp / "data.parquet")
            else:
                files = _digests(tmp, hashed if isinstance(hashed, dict) else digests)
                (tmp / "manifest.json").write_text(json.dumps({"kind": kind, "key": key, "files": files}, indent=1))
                digest = sha256_file(tmp / "manifest.json")
            ref = ArtifactRef(kind=kind, key=key, uri=f"{kind}/{key}", sha256=digest, rows=rows)
            (tmp / "ref.json").write_text(ref.model_dump_json(indent=1))
            fault_point(f"commit:{kind}")  # (tests: killed with the artifact complete but not yet in place)
            if final.exists():
                # A stale incomplete dir (no ref.json) from an older crash, or a concurrent writer won.
                done = self.find(kind, key)
                if done is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                    return done
                shutil.rmtree(final)
            done = self._place(tmp, final, kind, key)
            if done is not None:
                return done
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            self._raise_if_full(err, kind)
            raise
        if self.remote is not None:
            self._publish(ref)
        return ref

    def _raise_if_full(self, err: BaseException, kind: str) -> None:
        if isinstance(err, Exception) and _out_of_space(err):
            if self._behind:  # a write running beside this one may be what filled the disk: that is the one to name
                try:
                    self.settle()
                except StoreFullError as full:
                    raise full from err
            free = shutil.disk_usage(self.root).free
            raise StoreFullError(
                f"no space left under {self.root} while writing a {kind} artifact ({free / 2**20:.1f} MiB free "
                "now); its partial write was removed and every stored artifact is intact: free some space and "
                "rerun the same command to continue from the stored stages") from err

    # --- remote mirror (artifacts.remote) ----------------------------------------------------------

    def _publish(self, ref: ArtifactRef) -> None:
        """Publish a committed local artifact to the remote, then mark it published here."""
        from coopflow.artifacts.remote import RemoteError

        root = self.location(ref)
        try:
            self.remote.publish(ref.kind, ref.key, root, (root / "ref.json").read_text())
        except RemoteError as err:
            raise ArtifactError(f"{err} (the artifact is intact locally; rerun to publish it)") from None
        (root / PUBLISHED).touch()

    def _place(self, tmp: Path, final: Path, kind: str, key: str) -> ArtifactRef | None:
        """Flush the complete copy `tmp` to the disk and rename it to `final` (the rename flushed too): None once it is
        there. A concurrent writer or fetch of the same key that renamed its own copy in after the caller's exists
        check wins (ENOTEMPTY): `tmp` is removed and the stored artifact returned."""
        sync_tree(tmp)
        try:
            os.replace(tmp, final)
            _fsync(final.parent)
            return None
        except OSError as err:
            done = self.find(kind, key) if err.errno in (errno.ENOTEMPTY, errno.EEXIST) else None
            if done is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return done

    def _fetch(self, kind: str, key: str) -> ArtifactRef | None:
        """Download a remote artifact into place here (verified first), or None when the remote lacks it."""
        from coopflow.artifacts.remote import RemoteError

        try:
            record = self.remote.record(kind, key)
        except RemoteError as err:
            raise ArtifactError(str(err)) from None
        if record is None:
            return None
        try:
            ref = ArtifactRef.model_validate(record["ref"])
        except ValueError:
            raise ArtifactError(f"commit record of {kind}/{key} on {self.remote.url} holds no valid ref") from None
        if (ref.kind, ref.key) != (kind, key):
            raise ArtifactError(f"commit record of {kind}/{key} on {self.remote.url} names {ref.kind}/{ref.key}")
        final = self.path(kind, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            self.remote.download(kind, key, record, tmp)
            try:  # the same checks as every local read, before anything lands
                self._check_files(tmp, ref, table=not (tmp / "manifest.json").is_file())
            except ArtifactError as err:
                raise ArtifactError(f"{self.remote.url}/{kind}/{key}: the downloaded copy does not verify "
                                    f"({err})") from None
            (tmp / "ref.json").write_text(ref.model_dump_json(indent=1))
            (tmp / PUBLISHED).touch()
            if final.exists():
                if (final / "ref.json").is_file():  # a concurrent fetch or write got here first
                    shutil.rmtree(tmp, ignore_errors=True)
                    return self.find(kind, key)
                shutil.rmtree(final)
            return self._place(tmp, final, kind, key) or ref
        except RemoteError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ArtifactError(str(err)) from None
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            self._raise_if_full(err, kind)
            raise

    def remove(self, kind: str, key: str) -> bool:
        """Delete one artifact here and on the remote (renamed away / its commit record deleted first, so readers
        never see half of it); True if it existed."""
        remote = self.remote.remove(kind, key) if self.remote is not None else False
        final = self.path(kind, key)
        if not final.exists():
            return remote
        trash = final.parent / f".tmp-del-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def put_subset(self, kind: str, src: ArtifactRef, key: str, keep: Callable[[str], bool]) -> ArtifactRef:
        """A new dir artifact `key` holding the files of `src` (verified first) whose manifest path passes `keep`,
        hard-linked where the filesystem allows (no second copy on disk), else copied; committed atomically like
        every write. The source is left as it is (`remove` it to free its space)."""
        existing = self.find(kind, key)
        if existing is not None:
            return existing
        root = self.open_dir(src)
        files = {rel: d for rel, d in json.loads((root / "manifest.json").read_text())["files"].items() if keep(rel)}

        def write(tmp: Path) -> None:
            for rel in files:
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(root / rel, dst)
                except OSError:
                    shutil.copy2(root / rel, dst)

        return self._commit(kind, key, write, rows=None, table=False, digests=dict(sorted(files.items())))

    def size(self, kind: str, key: str, under: str | None = None) -> int:
        """Bytes of an artifact's files (only those below its sub-folder `under` when given); 0 when absent.
        A file hard-linked into several artifacts counts in each."""
        root = self.path(kind, key)
        if under:
            root = root / under
        if not root.exists():
            return 0
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())

    def artifacts(self, kind: str | None = None) -> list[tuple[str, str]]:
        """(kind, key) of every stored artifact directory (of one kind when given), hidden dirs excluded."""
        out = []
        kinds = [self.root / kind] if kind else sorted(p for p in self.root.iterdir() if p.is_dir())
        for kind_dir in kinds:
            if kind_dir.name.startswith(".") or not kind_dir.is_dir():
                continue
            out += [(kind_dir.name, a.name) for a in sorted(kind_dir.iterdir())
                    if a.is_dir() and not a.name.startswith(".")]
        return out

    def lock(self, name: str, keys: list[str] | None = None) -> "RunLock":
        """An exclusive lock on `name` among the processes sharing this store (an OS file lock: released when
        its holder exits or is killed, so a dead holder never blocks anyone). `keys`: what the holder works on
        (recorded in the lock file for `held_locks`)."""
        return RunLock(self.root / ".locks" / f"{name}.lock", keys)

    def held_locks(self) -> list[dict]:
        """The locks some process holds now: [{"name", "pid", "since", "keys"}] (a lock file nobody holds is
        skipped; one held by an older writer that recorded nothing has since 0 and no keys)."""
        import fcntl

        out = []
        for f in sorted((self.root / ".locks").glob("*.lock")) if (self.root / ".locks").is_dir() else []:
            with open(f, "a+") as h:
                try:
                    fcntl.flock(h, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    fcntl.flock(h, fcntl.LOCK_UN)
                    continue  # nobody holds it
                except BlockingIOError:
                    pass
                h.seek(0)
                try:
                    info = json.loads(h.read() or "{}")
                except ValueError:
                    info = {}
            out.append({"name": f.stem, "pid": info.get("pid"), "since": float(info.get("since") or 0.0),
                        "keys": list(info.get("keys") or [])})
        return out

    def verify_all(self) -> tuple[int, list[tuple[str, str, str]]]:
        """Check every stored artifact (its record, data file or manifest and every file's digest): returns
        (how many were checked, [(kind, key, problem)] for the bad ones)."""
        found, bad = self.artifacts(), []
        for kind, key in found:
            art = self.path(kind, key)
            try:
                ref = self.find(kind, key)
                if ref is None:
                    raise ArtifactError(f"artifact {kind}/{key} has no record (ref.json): an incomplete write")
                if (art / "data.parquet").is_file() and not (art / "manifest.json").is_file():
                    self.read_table(ref)
                else:
                    self.open_dir(ref)
            except ArtifactError as err:
                bad.append((kind, key, str(err)))
        return len(found), bad

    def quarantine(self, kind: str, key: str) -> Path:
        """Move a bad artifact aside to `<root>/.quarantine/<kind>/<key>-<n>` (kept for inspection, never read
        again), so the stage that made it recomputes it on the next run."""
        src = self.path(kind, key)
        dst_dir = self.root / ".quarantine" / kind
        dst_dir.mkdir(parents=True, exist_ok=True)
        dst = dst_dir / f"{key}-{uuid.uuid4().hex[:6]}"
        os.replace(src, dst)
        return dst

    def clean_temp(self, stale_after_s: float = 3600.0) -> int:
        """Remove temp dirs left by killed processes; returns how many were removed. A temp dir names the process
        writing it: one whose process is still alive (another run's write in progress) is left alone; one without
        a process id (older stores) only once it is `stale_after_s` old."""
        import time

        n = 0
        for kind_dir in self.root.iterdir() if self.root.exists() else []:
            if not kind_dir.is_dir():
                continue
            for t in kind_dir.glob(".tmp-*"):
                pid = _writer_pid(t.name)
                if pid is not None and process_alive(pid):
                    continue
                if pid is None:
                    try:
                        if time.time() - t.stat().st_mtime < stale_after_s:
                            continue
                    except FileNotFoundError:
                        continue
                shutil.rmtree(t, ignore_errors=True)
                n += 1
        return n


class PendingDir:
    """A directory artifact whose files are still being written (`ArtifactStore.put_dir_behind`).

    `key`/`kind` are known now; `result()` waits for the writes, commits and returns the `ArtifactRef` (the same
    ref on every call; a failed write raises its error on every call, its temp dir removed); `after(fn)` runs
    `fn(ref)` once it is committed (at once when it already is)."""

    def __init__(self, store: ArtifactStore, kind: str, key: str, tmp: Path, finish: Callable[[], dict[str, str]]):
        self.store, self.kind, self.key, self._tmp, self._finish = store, kind, key, tmp, finish
        self._ref: ArtifactRef | None = None
        self._error: BaseException | None = None
        self._after: list[Callable[[ArtifactRef], None]] = []
        self.started = time.time()
        self.seconds: float | None = None  # once committed: from put_dir_behind's return to the end of the writes

    @property
    def done(self) -> bool:
        """Committed (or failed): `result()` no longer waits."""
        return self._ref is not None or self._error is not None

    def result(self) -> ArtifactRef:
        if self._error is not None:
            raise self._error
        if self._ref is None:
            self.wait()
        if self._error is not None:
            raise self._error
        return self._ref

    def wait(self) -> float:
        """Finish and commit (an error is kept for `result`); the seconds spent waiting here."""
        if self.done:
            return 0.0
        t0 = time.perf_counter()
        self.store._behind.pop((self.kind, self.key), None)  # (settled from here on: never waited for twice)
        try:
            digests = self._finish()
            self._ref = self.store._commit(self.kind, self.key, lambda d: None, rows=None, table=False,
                                           digests=digests, tmp=self._tmp)  # (removes the temp dir if it fails)
            ended = getattr(self._finish, "ended", None) or time.time()  # (`finish` may say when its writes ended)
            self.seconds = max(0.0, ended - self.started)
        except BaseException as err:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._error = err
            if not isinstance(err, StoreFullError):
                try:
                    self.store._raise_if_full(err, self.kind)
                except StoreFullError as full:
                    self._error = full
        if self._ref is not None:
            for fn in self._after:
                fn(self._ref)
            self._after.clear()
        return time.perf_counter() - t0

    def after(self, fn: Callable[[ArtifactRef], None]) -> None:
        if self._ref is not None:
            fn(self._ref)
        elif self._error is None:
            self._after.append(fn)


class RunLock:
    """`with store.lock(name) as waited:` holds an exclusive flock; `waited` tells whether another holder had it.

    While held, the lock file records its holder: {"pid", "since" (epoch seconds), "keys"} — `keys` are what the
    holder reads and writes (a run's segment end keys), so `coopflow gc` leaves them and everything written since
    alone (`held_locks`)."""

    def __init__(self, path: Path, keys: list[str] | None = None):
        self.path, self._f, self.keys = path, None, list(keys or [])

    def __enter__(self) -> bool:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a+")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            fcntl.flock(self._f, fcntl.LOCK_EX)  # another process runs this: wait for it (Ctrl-C interrupts)
            waited = True
        import time

        self._f.seek(0)
        self._f.truncate()
        self._f.write(json.dumps({"pid": os.getpid(), "since": time.time(), "keys": self.keys}))
        self._f.flush()
        return waited

    def __exit__(self, *exc) -> None:
        import fcntl

        if self._f is not None:
            fcntl.flock(self._f, fcntl.LOCK_UN)
            self._f.close()
            self._f = None


def _writer_pid(name: str) -> int | None:
    """The process id in a temp dir's name ('.tmp-[del-]<key>-<pid>-<hex>'), None for the older format."""
    parts = name.split("-")
    if len(parts) >= 4 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return True
