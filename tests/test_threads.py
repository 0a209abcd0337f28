"""Torch threads (issue 22): derived from the CPUs this process may use and the runs beside it, never more."""

import os

import pytest

from coopflow.stages.common.threads import choose_threads, usable_cpus


@pytest.fixture
def cgroup(tmp_path):
    made = []

    def make(cpu_max: str | None = None, v1: tuple[int, int] | None = None):
        root = tmp_path / str(len(made))
        root.mkdir()
        made.append(root)
        if cpu_max is not None:
            (root / "cpu.max").write_text(cpu_max + "\n")
        if v1 is not None:
            (root / "cpu").mkdir()
            (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
            (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
        return root
    return make


def test_usable_cpus_is_the_affinity_capped_by_a_cgroup_quota(cgroup, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert usable_cpus(cgroup()) == 4                              # no quota files
    assert usable_cpus(cgroup("max 100000")) == 4                  # v2, unlimited
    assert usable_cpus(cgroup("150000 100000")) == 1               # v2, 1.5 CPUs -> 1
    assert usable_cpus(cgroup("300000 100000")) == 3


def test_usable_cpus_reads_cgroup_v1(cgroup, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    assert usable_cpus(cgroup(v1=(200000, 100000))) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert usable_cpus(cgroup(v1=(-1, 100000))) == 1


def test_choose_threads_explicit_then_omp_then_cpus_over_runs(cgroup, monkeypatch):
    root = cgroup()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("COOPFLOW_CONCURRENT_RUNS", raising=False)
    assert choose_threads(3, root) == (3, "agents.torch_threads / --threads")
    assert choose_threads(None, root) == (4, "4 usable CPUs")
    monkeypatch.setenv("COOPFLOW_CONCURRENT_RUNS", "5")  # `coopflow serve` runs up to 5 at once
    assert choose_threads(None, root) == (1, "4 usable CPUs / 5 runs at once")
    monkeypatch.setenv("COOPFLOW_CONCURRENT_RUNS", "2")
    assert choose_threads(None, root) == (2, "4 usable CPUs / 2 runs at once")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's own choice wins over the derived one
    assert choose_threads(None, root) == (1, "OMP_NUM_THREADS")
    assert choose_threads(2, root)[0] == 2


def test_the_config_field_is_checked():
    from coopflow.schemas.config import ConfigError, validate_config

    assert validate_config({"agents": {"agent_model": "tiny", "torch_threads": 2},
                            "trainer": {"num_turns": 1}}).agents.torch_threads == 2
    with pytest.raises(ConfigError, match="agents.torch_threads"):
        validate_config({"agents": {"agent_model": "tiny", "torch_threads": 0}, "trainer": {"num_turns": 1}})
