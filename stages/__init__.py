"""Pure pipeline stages: plain typed functions over artifact refs (no Prefect, no MLflow)."""
