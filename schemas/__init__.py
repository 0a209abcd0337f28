"""Pydantic run configs and pyarrow artifact schemas: the single source of truth for field names."""

from coopflow.schemas.config import (ConfigError, MAGRPOConfig, RunConfig, apply_overrides, load_config,  # noqa: F401
                            validate_config)
from coopflow.schemas.tables import SCHEMA_VERSION, TABLES, schema_for  # noqa: F401
