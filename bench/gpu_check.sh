#!/usr/bin/env bash
# The GPU check of issue 23 as one prepared command (see bench/gpu_check.py for the steps).
#   bash bench/gpu_check.sh            # on a CUDA machine: under 8 minutes on one GPU, installs nothing big
#   bash bench/gpu_check.sh --dry-run  # every step on the CPU with a tiny model (checks the script itself)
# Results are printed one line per step; --out FILE also writes them as JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
# the device image has torch, transformers and peft; coopflow's own light dependencies install from PyPI wheels
# when present locally, else the script reports the step that needs them
"$PY" -c "import pydantic, pyarrow, yaml" 2>/dev/null || "$PY" -m pip install -q pydantic pyarrow pyyaml 2>/dev/null
exec timeout 480 "$PY" bench/gpu_check.py "$@"
