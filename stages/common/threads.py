"""How many torch threads a run uses: never more than the CPUs it may use, shared by the runs beside it.

On a small machine oversubscribed torch threads spin-wait on each other: measured here, HF generation took
0.24 s/token with 1 thread and 3.07 s/token with 2 threads while another job used a core. The default is
therefore derived, not torch's (one per core of the machine):

    threads = max(1, usable CPUs // runs at once)

- usable CPUs: this process's CPU affinity, capped by a cgroup CPU quota (containers, CI runners);
- runs at once: `coopflow serve` runs up to $PREFECT_RUNNER_PROCESS_LIMIT flow runs concurrently and exports
  $COOPFLOW_CONCURRENT_RUNS for them (1 otherwise);
- `parallel_training: mp` workers then split the run's threads between them (stages.agents.workers); Ray actors
  use their own CPU reservation.

`agents.torch_threads` (or `coopflow run --threads N`) sets it explicitly; an exported OMP_NUM_THREADS is
respected when the setting is left automatic.
"""

import math
import os
from pathlib import Path

__all__ = ["usable_cpus", "choose_threads", "apply_threads"]


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup CPU quota (v2 cpu.max, or v1 cfs files), None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup quota (at least 1)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def choose_threads(setting: int | None, cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """(threads, why): the explicit setting, an exported OMP_NUM_THREADS, or usable CPUs // runs at once."""
    if setting:
        return setting, "agents.torch_threads / --threads"
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        return int(omp), "OMP_NUM_THREADS"
    cpus = usable_cpus(cgroup_root)
    runs = os.environ.get("COOPFLOW_CONCURRENT_RUNS", "")
    runs_n = int(runs) if runs.isdigit() and int(runs) > 0 else 1
    why = f"{cpus} usable CPU{'s' if cpus != 1 else ''}" + (f" / {runs_n} runs at once" if runs_n > 1 else "")
    return max(1, cpus // runs_n), why


def apply_threads(setting: int | None) -> tuple[int, str]:
    """Set torch's intra-op threads for this process; (threads, why)."""
    import torch

    n, why = choose_threads(setting)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n, why
