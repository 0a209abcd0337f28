"""The artifact store: content-addressed Parquet tables and checkpoint dirs, atomic writes, sha256 on read."""

from coopflow.artifacts.store import (ArtifactError, ArtifactRef, ArtifactStore, StoreFullError,  # noqa: F401
                             canonical_json, key_for, sha256_file)
