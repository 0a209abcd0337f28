"""Deployment objects built by `coopflow serve`: names, schedules, default parameters."""

from datetime import timedelta


def test_deployments_names_schedules_and_defaults():
    from flows.serve import deployments

    deps = deployments("nightly", cron="0 3 * * *", config_path="/abs/configs/magrpo-story.yaml")
    assert sorted(d.name for d in deps) == ["nightly"] * 11
    assert {d.flow_name for d in deps} == {"train-magrpo", "train-magrpo-centralized", "train-mareinforce", "train-marloo", "train-maremax",
                                                 "train-iac", "train-maac", "train-madpo", "train-marlhf",
                                                 "train-madpo-iter", "train-marlhf-iter"}
    for d in deps:
        extra = {"max_new_rounds": 1} if d.flow_name.endswith("-iter") else {}  # one round per scheduled run
        assert d.parameters == {"config_path": "/abs/configs/magrpo-story.yaml", **extra}
        assert [s.schedule.cron for s in d.schedules] == ["0 3 * * *"]
    every = deployments("local", interval=3600)
    assert all(s.schedule.interval == timedelta(hours=1) for d in every for s in d.schedules)
    assert all(not d.schedules for d in deployments("local"))


def test_the_cli_knows_every_flow():
    from flows.cli import FLOW_NAMES, ITERATIVE
    from flows.train import FLOWS

    assert FLOW_NAMES == tuple(FLOWS) and set(ITERATIVE) == {f for f in FLOWS if f.endswith("-iter")}
