"""bench/gpu_check.sh --dry-run: the GPU check's every step (model build, decode-vs-generate correctness, generation
speed, in-process and mp training) runs on the CPU with a tiny model and reports each step (issue 23)."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_passes_every_step(tmp_path):
    r = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run", "--out", str(tmp_path / "gpu.json")], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "'verdict': 'PASS'" in r.stdout and "0 failed" in r.stdout
    import json

    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["training env_steps/s (coopflow, 2 agents)"]["mp"]["env_steps_per_s"] > 0
