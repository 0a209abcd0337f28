"""The artifact store: content-addressed Parquet tables and checkpoint dirs, atomic writes, sha256 on read."""

from artifacts.store import (ArtifactError, ArtifactRef, ArtifactStore, canonical_json, key_for,  # noqa: F401
                             sha256_file)
