"""A remote mirror of the artifact store on object storage (S3, GCS, Azure, any fsspec filesystem).

Object stores have no atomic rename, so the local store's commit (temp dir + one `rename`) does not carry
over. The mirror commits differently, with the same guarantee — a reader sees a whole artifact or none:

1. every file of a committed local artifact is uploaded under a fresh, never-reused prefix
   `<url>/<kind>/<key>/<commit-id>/...` (a single PUT is atomic on S3/GCS/Azure: an object is either
   absent or complete);
2. then one small *commit record* `<url>/<kind>/<key>/commit.json` is written: the artifact's
   `ArtifactRef`, the commit id and the file list. Readers follow commit records only, so a writer killed
   before step 2 leaves unreferenced objects, never a visible partial artifact;
3. a reader downloads the files the record lists into a temp dir of its local store, verifies each
   against the ref's sha256 (table) or manifest (directory), and only then renames it into place.

On a filesystem with real directories (a `file://` mirror, e.g. on a shared mount) the mirror makes each
file's folder before writing it; object stores have no folders to make.

Two machines committing the same key race on `commit.json`; whichever record lands last wins, and each
record points at its own complete object set, so a reader never mixes two writers' files. (Keys are
input-addressed: both writers computed the same stage from the same inputs.) Locks stay local: run-key
locks do not span machines over object storage. `remove` deletes the commit record first, then objects.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

COMMIT = "commit.json"


class RemoteError(RuntimeError):
    """The remote store could not be reached or refused a request."""


class RemoteMirror:
    """Artifacts published under one fsspec URL (`s3://bucket/prefix`, `gs://...`, `memory://...`)."""

    def __init__(self, url: str, options: dict | None = None):
        try:
            import fsspec
        except ImportError as err:  # (datasets depends on fsspec: only a stripped install lacks it)
            raise RemoteError("remote_store needs fsspec: pip install fsspec") from err
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **(options or {}))
        except (ImportError, ValueError) as err:
            scheme = url.split("://", 1)[0]
            hint = {"s3": "s3fs ('coopflow[s3]')", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
            raise RemoteError(f"remote_store {url!r}: cannot open the {scheme}:// filesystem ({err}); install "
                              f"{hint.get(scheme, 'its fsspec implementation')}") from None
        self.url = url
        self.root = root.rstrip("/")
        # (fsspec's local filesystem writes no file into a missing folder; object stores have no folders)
        self._makes_dirs = bool({"file", "local"} & set(_protocols(self.fs)))

    def _dir(self, kind: str, key: str) -> str:
        return f"{self.root}/{kind}/{key}"

    def __repr__(self) -> str:
        return f"RemoteMirror({self.url!r})"

    # --- publish ---------------------------------------------------------------------------------

    def publish(self, kind: str, key: str, local: Path, ref_json: str) -> None:
        """Upload a committed local artifact dir (objects first, commit record last)."""
        from coopflow.artifacts.faults import hit

        commit_id = uuid.uuid4().hex
        base = f"{self._dir(kind, key)}/{commit_id}"
        files = sorted(str(p.relative_to(local)) for p in local.rglob("*")
                       if p.is_file() and p.relative_to(local).as_posix() not in ("ref.json", ".published"))
        try:
            self._folders([f"{base}/{rel}" for rel in files])
            for rel in files:
                self.fs.put_file(str(local / rel), f"{base}/{rel}")
            hit(f"publish:{kind}")  # (tests: killed with the objects uploaded, the commit record not yet)
            record = {"ref": json.loads(ref_json), "commit": commit_id, "files": files}
            self.fs.pipe_file(f"{self._dir(kind, key)}/{COMMIT}", json.dumps(record, indent=1).encode())
        except OSError as err:
            raise RemoteError(f"could not publish {kind}/{key} to {self.url}: {err}") from err

    def _folders(self, paths: list[str]) -> None:
        """Make the folders these files go into, where the filesystem has folders."""
        if self._makes_dirs:
            for folder in sorted({p.rsplit("/", 1)[0] for p in paths}):
                self.fs.makedirs(folder, exist_ok=True)

    # --- read ------------------------------------------------------------------------------------

    def record(self, kind: str, key: str) -> dict | None:
        """The commit record of an artifact, or None when none was published."""
        path = f"{self._dir(kind, key)}/{COMMIT}"
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RemoteError(f"could not read {self.url}/{kind}/{key}/{COMMIT}: {err}") from err
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or not {"ref", "commit", "files"} <= rec.keys():
                raise ValueError("missing fields")
            return rec
        except ValueError as err:
            raise RemoteError(f"commit record {self.url}/{kind}/{key}/{COMMIT} is corrupted ({err})") from None

    def download(self, kind: str, key: str, record: dict, into: Path) -> None:
        """Download the files a commit record lists into the (empty, local) dir `into`."""
        base = f"{self._dir(kind, key)}/{record['commit']}"
        for rel in record["files"]:
            if rel.startswith(("/", "..")) or "/../" in rel:
                raise RemoteError(f"commit record of {kind}/{key} lists an unsafe path {rel!r}")
            dst = into / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get_file(f"{base}/{rel}", str(dst))
            except FileNotFoundError:
                raise RemoteError(f"{self.url}/{kind}/{key}: file {rel} of commit {record['commit']} is "
                                  "missing") from None
            except OSError as err:
                raise RemoteError(f"could not download {kind}/{key}/{rel} from {self.url}: {err}") from err

    # --- delete ----------------------------------------------------------------------------------

    def remove(self, kind: str, key: str) -> bool:
        """Delete an artifact's commit record (readers stop seeing it), then its objects; True if it existed."""
        d = self._dir(kind, key)
        self.fs.invalidate_cache()  # (listings may be cached; other machines change the bucket)
        existed = self.fs.exists(f"{d}/{COMMIT}")
        if existed:
            self.fs.rm_file(f"{d}/{COMMIT}")
        if self.fs.exists(d):
            self.fs.rm(d, recursive=True)
        return existed

    def keys(self) -> list[tuple[str, str]]:
        """(kind, key) of every published artifact."""
        out = []
        self.fs.invalidate_cache()
        for path in self.fs.glob(f"{self.root}/*/*/{COMMIT}"):
            parts = str(path).rstrip("/").split("/")
            out.append((parts[-3], parts[-2]))
        return sorted(out)


def _protocols(fs) -> tuple[str, ...]:
    """The URL schemes an fsspec filesystem answers to (`protocol` is a string or a tuple)."""
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)
