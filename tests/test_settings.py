"""A stage sees only the settings its key holds (`coopflow.stages.planning.settings`).

- a view reads the fields its kind and the kinds upstream of it declare, and refuses every other one in one line
  naming the field and where to declare it; execution settings are a separate view, never in a key;
- views are frozen, and a section read through one is a copy;
- properties of the config models read through a view only when the fields they are computed from are held;
- what a key hashes is the declared values, read once per run;
- no stage but planning touches a RunConfig (the architecture rule that makes the above hold by construction).
"""

import ast
from pathlib import Path

import pytest

from coopflow.schemas.config import validate_config
from coopflow.stages.planning.inputs import INPUTS, declared_values
from coopflow.stages.planning.settings import RunSettings, UndeclaredSetting, chain
from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[1]


def _settings(tmp_path, **trainer):
    data = small_config(tmp_path)
    data["trainer"].update(trainer)
    return RunSettings.of(validate_config(data))


def test_a_view_reads_what_its_key_holds_and_refuses_the_rest_in_one_line(tmp_path):
    s = _settings(tmp_path, temperature=0.7)
    assert s.rollouts.trainer.temperature == 0.7 and s.rollouts.seed == s.start.seed
    assert s.policy.trainer.temperature == 0.7  # the policy key holds the rollouts key: upstream settings read
    with pytest.raises(UndeclaredSetting) as err:
        s.rollouts.trainer.agent_learning_rate  # an update setting: the rollouts key does not hold it
    msg = str(err.value)
    assert "'trainer.agent_learning_rate'" in msg and "rollouts stage" in msg and "INPUTS" in msg
    assert "\n" not in msg
    with pytest.raises(UndeclaredSetting, match="'trainer.agent_learning_rate'"):
        s.eval.trainer.agent_learning_rate  # an evaluation's key holds the checkpoint's start, not its updates
    with pytest.raises(UndeclaredSetting, match="tracking"):  # execution settings are never a stage's input
        s.policy.tracking
    assert s.execution.tracking.enabled in (True, False) and s.execution.trainer.parallel_training == "none"
    with pytest.raises(UndeclaredSetting):
        s.execution.trainer.temperature
    with pytest.raises(AttributeError, match="no setting 'trainer.no_such_field'"):
        s.policy.trainer.no_such_field


def test_views_are_frozen_and_sections_are_copies(tmp_path):
    data = small_config(tmp_path)
    data["agents"]["lora"] = {"r": 4}
    cfg = validate_config(data)
    s = RunSettings.of(cfg)
    with pytest.raises(AttributeError, match="frozen"):
        s.rollouts.seed = 3
    lora = s.start.agents.lora
    lora.r = 99
    assert s.start.agents.lora.r == 4
    cfg.seed = 12345  # the settings hold their own copy of the config
    assert s.start.seed != 12345 and s.declared["rollouts"]["seed"] != 12345


def test_derived_properties_read_only_with_the_fields_they_come_from(tmp_path):
    s = _settings(tmp_path, train_batch_size=None, rollout_buffer_size=3)
    assert s.policy.trainer.batch_size == 3  # train_batch_size null: the buffer size (both in the policy key)
    with pytest.raises(UndeclaredSetting, match="rollout_buffer_size"):
        s.rollouts.trainer.batch_size
    assert s.advantages.advantage_mode == s.policy.advantage_mode
    assert s.rollouts.formatter_for(0) is not None
    with pytest.raises(UndeclaredSetting, match="formatters"):
        s.start.formatter_for(0)
    assert s.policy.trainer.held("reference_kl_enabled", "x") is False
    assert s.eval.trainer.held("reference_kl_enabled", "x") == "x"  # not the config's value


def test_held_gives_the_default_only_for_a_setting_not_held():
    """`held(name, default)`: the default where the section has no such setting or the view does not hold it; an
    AttributeError raised inside a derived setting's own code is a bug and surfaces, never a silent default."""
    from pydantic import BaseModel

    from coopflow.stages.planning.settings import Settings

    class Section(BaseModel):
        x: int = 1
        y: int = 2

        @property
        def broken(self) -> int:
            return self.no_such_field  # a bug in a derived setting

    view = Settings(Section(), frozenset({"x", "broken"}), frozenset(), "test stage")
    assert view.held("x", 0) == 1
    assert view.held("y", 0) == 0  # not held by this view
    assert view.held("nope", 0) == 0  # no such setting
    with pytest.raises(AttributeError, match="no_such_field"):
        view.held("broken", 0)


def test_keys_hash_the_declared_values(tmp_path):
    cfg = validate_config(small_config(tmp_path))
    s = RunSettings.of(cfg)
    assert set(s.declared) == set(INPUTS)
    for kind in INPUTS:
        assert dict(s.declared[kind]) == declared_values(cfg, kind)
    from coopflow.stages.planning.keys import declared_key

    other = RunSettings.of(validate_config({**small_config(tmp_path), "seed": 7}))
    assert declared_key("rollouts", "rollouts", s, {}) != declared_key("rollouts", "rollouts", other, {})
    assert declared_key("model", "model", s, {}) == declared_key("model", "model", other, {})


def test_every_chain_names_declared_kinds():
    names = ("model", "plan", "start", "rollouts", "scores", "advantages", "ac_samples", "policy", "steps", "metrics",
             "eval", "critic", "candidates", "pairs", "preference_scores", "dpo", "dpo_metrics", "reward_model",
             "round", "round_metrics")
    for name in names:
        for flags in ((False, False, False), (True, True, False), (False, False, True)):
            kinds = chain(name, *flags)
            assert kinds and set(kinds) <= set(INPUTS), (name, kinds)
    assert "episode" in chain("rollouts", False, True) and "episode" not in chain("rollouts", False, False)
    assert chain("reward_model", False, False, True) == ("start", "round")


# --- the architecture rule ---------------------------------------------------------------------------------

CONFIG_ROOMS = {"stages/planning/context.py", "stages/planning/settings.py", "stages/planning/inputs.py",
                "stages/operations/preflight.py"}
"""The only modules under stages/ that hold a run's config: planning builds the context and its settings from it,
the pre-flight checks it. (Lower rooms take their own sections: a taskset builder its TasksetConfig.)"""


def test_no_stage_but_planning_holds_a_run_config():
    from coopflow.stages.planning.context import RunContext

    assert "cfg" not in RunContext.__dataclass_fields__ and "config" not in RunContext.__dataclass_fields__
    found = []
    for p in sorted((REPO / "stages").rglob("*.py")):
        rel = p.relative_to(REPO).as_posix()
        if rel in CONFIG_ROOMS:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name in ("RunConfig", "validate_config") for a in node.names):
                found.append(f"{rel}:{node.lineno}: imports {', '.join(a.name for a in node.names)}")
            if isinstance(node, ast.Attribute) and node.attr in ("cfg", "_config"):
                found.append(f"{rel}:{node.lineno}: reads .{node.attr}")
    assert not found, "stages read their settings views, not the config:\n" + "\n".join(found)
