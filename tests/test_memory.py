"""keep_freed_memory: a large block freed and allocated again is served from memory the process already has (no
page faults), and the user's opt-out or own glibc settings leave malloc alone. Each case runs in a fresh process:
mallopt changes the process for good."""

import os
import subprocess
import sys

import pytest

_PROBE = """
import resource, sys, torch
from coopflow.stages.common.memory import keep_freed_memory
said = keep_freed_memory() if sys.argv[1] == "1" else "-"
x = torch.ones(64 * 2**20 // 4); del x  # 64 MB: above glibc's largest mmap threshold (32 MB)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
y = torch.ones(48 * 2**20 // 4)  # 48 MB: fits in the freed block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, said, sep="|")
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc (Linux)")


def _faults(apply: bool, **env) -> tuple[int, str]:
    """Page faults of allocating (and writing) a 48 MB tensor after freeing one of 64 MB, and what keep_freed_memory
    said, in a fresh process."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", _PROBE, "1" if apply else "0"], env=full, capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    faults, said = out.split("|", 1)
    return int(faults), said


def test_freed_block_is_reused_without_page_faults():
    pages = 48 * 2**20 // 4096
    plain, _ = _faults(False)
    kept, said = _faults(True)
    assert plain > pages // 2  # glibc unmapped the freed block: every page of the new one faults in again
    assert kept < pages // 20, said  # the freed block is reused, its pages already resident
    assert said.startswith("kept for reuse")


@pytest.mark.parametrize("env", [{"COOPFLOW_KEEP_FREED_MEMORY": "0"}, {"MALLOC_TRIM_THRESHOLD_": "1000000"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}])
def test_opt_out_and_users_own_settings_leave_malloc_alone(env):
    faults, said = _faults(True, **env)
    assert said.startswith("left as it is (") and next(iter(env)) in said
    if "COOPFLOW_KEEP_FREED_MEMORY" in env:
        assert faults > 48 * 2**20 // 4096 // 2  # nothing changed: the new block faults in again
