"""The artifact store: content-addressed Parquet tables and checkpoint dirs, atomic writes, digests checked on read."""

from coopflow.artifacts.store import (ArtifactError, ArtifactRef, ArtifactStore, StoreFullError,  # noqa: F401
                             canonical_json, file_digest, key_for, sha256_file)
