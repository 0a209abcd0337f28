#!/usr/bin/env bash
# Create a separate venv with the peer library (CoMLRL 1.4.3) for bench/ comparisons.
# Usage: bash bench/setup_peer.sh   (PEER_VENV overrides the location)
# torch is pinned to 2.13.0, the CPU wheel this machine serves locally; any other torch
# spec would download a multi-GB CUDA build. Idempotent: exits early if comlrl imports.
set -euo pipefail

VENV="${PEER_VENV:-$(dirname "$0")/../.bench/peer-venv}"
TORCH_PIN="torch==2.13.0"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import comlrl, torch, transformers, datasets" >/dev/null 2>&1; then
    echo "peer venv already set up" >&2
else
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    PY="$VENV/bin/python"
    # Hide the local mirror's harmless "Location ... is ignored" warnings.
    exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    "$PY" -m pip install --quiet "$TORCH_PIN"
    # Keep torch pinned while resolving the rest (comlrl 1.4.3 itself declares no torch requirement).
    CONSTRAINTS="$(mktemp)"
    trap 'rm -f "$CONSTRAINTS"' EXIT
    echo "$TORCH_PIN" > "$CONSTRAINTS"
    if ! "$PY" -m pip install --dry-run --quiet -c "$CONSTRAINTS" comlrl==1.4.3 transformers datasets >/dev/null; then
        echo "error: comlrl==1.4.3 + transformers + datasets do not resolve with $TORCH_PIN" >&2
        exit 1
    fi
    "$PY" -m pip install --quiet -c "$CONSTRAINTS" comlrl==1.4.3 transformers datasets
    "$PY" -c "import comlrl, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
fi

cd "$(dirname "$VENV/bin/python")" && echo "$(pwd -P)/python"
