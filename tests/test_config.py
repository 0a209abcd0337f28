"""Run config: CoMLRL 1.4.3's MAGRPOConfig defaults and checks, loading and overrides."""

import json

import pytest
from pydantic import ValidationError

from coopflow.schemas.config import (ALGORITHM_ADVANTAGE, ConfigError, MAGRPOConfig, RunConfig, apply_overrides, load_config,
                            read_config_file, validate_config)

SINGLE_TURN = {"trainer": {"num_turns": 1}}


def _cfg(**trainer) -> dict:
    """A minimal valid config dict (single turn) with extra trainer fields."""
    return {"trainer": {"num_turns": 1, **trainer}}


# --- defaults --------------------------------------------------------------------------------------


def test_trainer_defaults_match_reference():
    t = MAGRPOConfig()
    expected = {
        "num_train_epochs": 20, "agent_learning_rate": 5e-6, "logging_steps": 50, "parallel_training": "none",
        "agent_devices": None, "num_generations": 4, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6,
        "top_k": 50, "num_turns": 2, "discount": 1.0, "joint_mode": "aligned", "early_termination_threshold": -0.2,
        "external_prompt_passthrough": False, "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1,
        "rollout_buffer_size": 2, "train_batch_size": 2, "advantage_normalization": True, "num_agents": 2,
        "reference_kl_enabled": False, "reference_kl_coef": 0.1, "reference_devices": None,
    }
    got = t.model_dump()
    for name, value in expected.items():
        assert got[name] == value, name
    assert t.batch_size == t.rollout_buffer_size == 2  # train_batch_size None -> rollout_buffer_size


def test_train_batch_size_resolution():
    assert MAGRPOConfig(rollout_buffer_size=6).batch_size == 6
    assert MAGRPOConfig(rollout_buffer_size=6, train_batch_size=3).batch_size == 3


def test_run_config_defaults():
    cfg = validate_config(SINGLE_TURN)
    assert cfg.algorithm == "magrpo"
    assert cfg.advantage_mode == "mean"
    assert cfg.agents.n == 2  # the reference's default num_agents
    assert cfg.agents.sources() == ["tiny", "tiny"]
    assert cfg.trainer.num_generations == 4
    assert cfg.reward.name == "length_ratio"
    assert cfg.seed == 0


# --- trainer checks --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 0, -3])
def test_num_generations_below_two_rejected(k):
    with pytest.raises(ConfigError, match=r"trainer\.num_generations"):
        validate_config(_cfg(num_generations=k))


@pytest.mark.parametrize("field, value", [
    ("num_train_epochs", 0), ("logging_steps", 0), ("agent_learning_rate", 0.0), ("top_p", 1.5),
    ("temperature", 0.0), ("rollout_buffer_size", 0), ("train_batch_size", 0), ("eval_interval", -1),
    ("reference_kl_coef", -0.1), ("eval_batch_size", 0), ("num_turns", 0),
])
def test_trainer_bounds_rejected_naming_field(field, value):
    with pytest.raises(ConfigError, match=rf"trainer\.{field}"):
        validate_config(_cfg(**{field: value}))


@pytest.mark.parametrize("given, resolved", [
    ("aligned", "aligned"), ("align", "aligned"), ("cross", "cross"), ("crossed", "cross"), ("CROSSED", "cross"),
])
def test_joint_mode_aliases(given, resolved):
    assert validate_config(_cfg(joint_mode=given)).trainer.joint_mode == resolved


def test_bad_joint_mode_rejected():
    with pytest.raises(ConfigError, match=r"trainer\.joint_mode"):
        validate_config(_cfg(joint_mode="diagonal"))


@pytest.mark.parametrize("mode", ["mean", "raw", "max", "rloo"])
def test_advantage_modes_accepted(mode):
    cfg = validate_config(_cfg(advantage_mode=mode))
    assert cfg.advantage_mode == mode


@pytest.mark.parametrize("mode", ["median", "MEAN", "grpo"])
def test_bad_advantage_mode_rejected(mode):
    with pytest.raises(ConfigError, match=r"trainer\.advantage_mode"):
        validate_config(_cfg(advantage_mode=mode))


@pytest.mark.parametrize("value", ["auto", "invalid", "ddp"])
def test_parallel_training_bad_values_rejected(value):
    with pytest.raises(ValidationError, match="parallel_training"):
        MAGRPOConfig(parallel_training=value)
    with pytest.raises(ConfigError, match=r"trainer\.parallel_training"):
        validate_config(_cfg(parallel_training=value))


@pytest.mark.parametrize("value", ["null", "None", "none", None])
def test_parallel_training_null_becomes_none(value):
    assert MAGRPOConfig(parallel_training=value).parallel_training == "none"
    assert validate_config(_cfg(parallel_training=value)).trainer.parallel_training == "none"


def test_mp_requires_agent_devices():
    with pytest.raises(ValidationError, match="agent_devices"):
        MAGRPOConfig(parallel_training="mp")
    assert MAGRPOConfig(parallel_training="mp", agent_devices=["cuda:0", "cuda:1"]).parallel_training == "mp"
    with pytest.raises(ConfigError, match="agent_devices"):
        validate_config(_cfg(parallel_training="mp"))


def test_mp_with_devices_accepted_by_run_config():
    cfg = validate_config(_cfg(parallel_training="mp", agent_devices=["cpu", "cpu"]))
    assert cfg.trainer.parallel_training == "mp" and cfg.trainer.agent_devices == ["cpu", "cpu"]
    with pytest.raises(ConfigError, match="agent_devices"):
        validate_config(_cfg(parallel_training="mp"))


def test_multi_turn_rejected_by_run_config():
    with pytest.raises(ConfigError, match=r"trainer\.num_turns"):
        validate_config({"trainer": {"num_turns": 2}})


def test_reference_kl_accepted_by_run_config():
    cfg = validate_config(_cfg(reference_kl_enabled=True, reference_kl_coef=0.5))
    assert cfg.trainer.reference_kl_enabled and cfg.trainer.reference_kl_coef == 0.5


def test_top_k_null_allowed():
    assert validate_config(_cfg(top_k=None)).trainer.top_k is None


# --- unknown keys ----------------------------------------------------------------------------------


def test_unknown_trainer_key_named():
    with pytest.raises(ConfigError, match=r"trainer\.learning_rate"):
        validate_config(_cfg(learning_rate=1e-3))


def test_unknown_top_level_key_named():
    with pytest.raises(ConfigError, match="bogus_section"):
        validate_config({**SINGLE_TURN, "bogus_section": 1})


def test_unknown_agents_key_named():
    with pytest.raises(ConfigError, match=r"agents\.model_name"):
        validate_config({**SINGLE_TURN, "agents": {"agent_model": "tiny", "model_name": "x"}})


# --- algorithms ------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm, mode", [
    ("magrpo", "mean"), ("mareinforce", "raw"), ("marloo", "rloo"), ("maremax", "max"),
])
def test_algorithm_default_advantage_mode(algorithm, mode):
    assert ALGORITHM_ADVANTAGE[algorithm] == mode
    cfg = validate_config(SINGLE_TURN, algorithm=algorithm)
    assert cfg.algorithm == algorithm
    assert cfg.advantage_mode == mode
    assert cfg.trainer.advantage_mode is None
    # in the document, without the flow's algorithm argument
    assert validate_config({**SINGLE_TURN, "algorithm": algorithm}).advantage_mode == mode


def test_explicit_advantage_mode_overrides_algorithm_default():
    assert validate_config(_cfg(advantage_mode="max"), algorithm="marloo").advantage_mode == "max"


def test_algorithm_conflict_with_flow():
    with pytest.raises(ConfigError, match="algorithm"):
        validate_config({**SINGLE_TURN, "algorithm": "magrpo"}, algorithm="marloo")


def test_unknown_algorithm_rejected():
    with pytest.raises(ConfigError, match="algorithm"):
        validate_config({**SINGLE_TURN, "algorithm": "mappo"})


# --- agents ----------------------------------------------------------------------------------------


def test_agent_model_conflicting_agents_list():
    with pytest.raises(ConfigError, match="conflict"):
        validate_config({**SINGLE_TURN, "agents": {"agent_model": "tiny", "agents": ["tiny", "/some/other"]}})


def test_agent_model_with_matching_agents_list_ok():
    cfg = validate_config({**SINGLE_TURN, "agents": {"agent_model": "tiny", "agents": ["tiny", "tiny"]}})
    assert cfg.agents.sources() == ["tiny", "tiny"]


def test_heterogeneous_agents():
    cfg = validate_config({**SINGLE_TURN, "agents": {"agents": ["/m/a", "/m/b", "/m/c"]}})
    assert cfg.agents.n == 3
    assert cfg.agents.sources() == ["/m/a", "/m/b", "/m/c"]


def test_agents_list_length_must_match_num_agents():
    with pytest.raises(ConfigError, match="num_agents"):
        validate_config({**SINGLE_TURN, "agents": {"agents": ["/m/a", "/m/b"], "num_agents": 3}})


def test_agents_section_needs_a_model():
    with pytest.raises(ConfigError, match="agent_model"):
        validate_config({**SINGLE_TURN, "agents": {"num_agents": 2}})


def test_trainer_num_agents_alias():
    cfg = validate_config({"agents": {"agent_model": "tiny"}, "trainer": {"num_turns": 1, "num_agents": 3}})
    assert cfg.agents.n == 3
    assert cfg.agents.sources() == ["tiny"] * 3
    with pytest.raises(ConfigError, match="disagrees"):
        validate_config({"agents": {"agent_model": "tiny", "num_agents": 2},
                         "trainer": {"num_turns": 1, "num_agents": 3}})


def test_formatters_list_length_must_match_agents():
    with pytest.raises(ConfigError, match="formatters"):
        validate_config({**SINGLE_TURN, "formatters": [{"template": "{prompt}"}] * 3})
    cfg = validate_config({**SINGLE_TURN, "formatters": [{"template": "A: {prompt}"}, {"template": "B: {prompt}"}]})
    assert cfg.formatter_for(1).template == "B: {prompt}"


# --- loading ---------------------------------------------------------------------------------------


def test_load_config_yaml(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(
        "algorithm: maremax\n"
        "agents:\n  agent_model: tiny\n  num_agents: 3\n"
        "trainer:\n  num_turns: 1\n  num_generations: 6\n  joint_mode: crossed\n  agent_learning_rate: 1.0e-3\n"
        "seed: 7\n")
    cfg = load_config(p)
    assert isinstance(cfg, RunConfig)
    assert cfg.algorithm == "maremax" and cfg.advantage_mode == "max"
    assert cfg.agents.n == 3
    assert cfg.trainer.num_generations == 6
    assert cfg.trainer.joint_mode == "cross"
    assert cfg.trainer.agent_learning_rate == 1e-3
    assert cfg.seed == 7


def test_load_config_json_with_overrides(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps({"algorithm": "marloo", "trainer": {"num_turns": 1, "num_generations": 4, "top_k": 20}}))
    cfg = load_config(p, overrides=["trainer.num_generations=8", "trainer.top_k=null",
                                    "trainer.agent_learning_rate=1e-3", "reward.kwargs.lo=1.5", "seed=3"])
    assert cfg.trainer.num_generations == 8
    assert cfg.trainer.top_k is None
    assert cfg.trainer.agent_learning_rate == pytest.approx(1e-3)
    assert cfg.reward.kwargs == {"lo": 1.5}
    assert cfg.seed == 3
    assert cfg.advantage_mode == "rloo"


def test_load_config_override_validated():
    with pytest.raises(ConfigError, match=r"trainer\.num_generations"):
        load_config(overrides=["trainer.num_turns=1", "trainer.num_generations=1"])


def test_load_config_base_merge_and_dict_overrides(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("trainer:\n  num_turns: 1\n  top_k: 5\n")
    cfg = load_config(p, base={"trainer": {"top_p": 0.9}}, overrides={"trainer.temperature": 1.0})
    assert (cfg.trainer.top_k, cfg.trainer.top_p, cfg.trainer.temperature) == (5, 0.9, 1.0)


def test_bundled_example_config_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "magrpo-story.yaml")
    assert cfg.algorithm == "magrpo" and cfg.trainer.num_turns == 1


def test_apply_overrides_bad_forms():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["trainer.num_generations"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])
    d = apply_overrides({}, ["a.b.c=[1, 2]", "a.d=true"])
    assert d == {"a": {"b": {"c": [1, 2]}, "d": True}}


@pytest.mark.parametrize("name, text", [
    ("bad.yaml", "trainer: [unclosed\n  num_turns: 1\n"),
    ("bad.json", "{\"trainer\": {\"num_turns\": 1,}"),
])
def test_unparsable_file_gives_config_error(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(p)


def test_missing_file_gives_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_non_mapping_file_gives_config_error(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        read_config_file(p)


def test_empty_file_is_empty_mapping(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert read_config_file(p) == {}


# --- one declaration per trainer field -------------------------------------------------------------


DEFAULT_OVERRIDES = {
    # class (a trainer config or a field set it puts in front of its trainer base): fields it re-declares only for
    # another default (and, for the preference trainers, their own wording)
    "ActorCriticConfig": {"num_train_epochs", "logging_steps", "num_generations", "top_k", "rollout_buffer_size"},
    "MAREINFORCEConfig": {"advantage_mode"}, "MARLOOConfig": {"advantage_mode"}, "MAReMaxConfig": {"advantage_mode"},
    "CentralizedMAGRPOConfig": {"num_turns", "collaboration_mode"},  # single turn, one joint actor
    "MADPOConfig": {"num_train_epochs", "early_termination_threshold"},  # epochs over pairs; unused single-turn
    "MARLHFConfig": {"critic_learning_rate"},  # null: the RL backend's critic falls back to agent_learning_rate
    "_IterativeFields": {"preference_pairs_per_sample"},  # per-round defaults, shared by both iterative configs
    "MADPOIterConfig": {"num_train_epochs"},
    "MARLHFIterConfig": {"num_train_epochs", "reward_num_train_epochs"},  # one trainer base: MARLHF's num_generations
}
OTHER_OVERRIDES = {
    # (class, field): a re-declaration that changes a limit or the type, and why
    ("MAGRPOConfig", "num_generations"): "ge=2: the group baseline needs two samples",
    ("MARLHFConfig", "num_generations"): "ge=1 again: maac/iac take 1 (its validator asks >= 2 of the MAGRPO family)",
    ("MADPOConfig", "num_turns"): "le=1: the preference trainers are single-turn",
    ("_IterativeFields", "preference_num_candidates"): "ge=1: pairs are target vs comparator",
    ("_IterativeFields", "pair_selection"): "adds comparator_reward",
}


def _trainer_classes():
    import coopflow.schemas.config as C

    return [c for c in vars(C).values() if isinstance(c, type) and issubclass(c, C._TrainerBase)]


def test_each_trainer_field_is_declared_once():
    import inspect

    from coopflow.schemas.config import field_limits

    found = set()
    for trainer in _trainer_classes():  # each class of its MRO, field-set mixins included, against the later ones
        for i, cls in enumerate(trainer.__mro__):
            if not cls.__module__.startswith("coopflow."):
                continue
            for name in inspect.get_annotations(cls):
                base = next((b for b in trainer.__mro__[i + 1:] if name in inspect.get_annotations(b)), None)
                if base is None:
                    continue
                found.add((cls.__name__, name))
                assert name in DEFAULT_OVERRIDES.get(cls.__name__, ()) or (cls.__name__, name) in OTHER_OVERRIDES, \
                    f"{cls.__name__}.{name} re-declares {base.__name__}.{name}"
                if (cls.__name__, name) not in OTHER_OVERRIDES:
                    mine, theirs = cls.model_fields[name], base.model_fields[name]
                    assert field_limits(mine) == field_limits(theirs), f"{cls.__name__}.{name} limits"
                    assert mine.annotation == theirs.annotation, f"{cls.__name__}.{name} type"
    listed = {(c, f) for c, fs in DEFAULT_OVERRIDES.items() for f in fs} | set(OTHER_OVERRIDES)
    assert found == listed  # the allow-lists name exactly the re-declarations


def test_each_trainer_config_has_one_trainer_base():
    """No diamond: a trainer config extends exactly one trainer config (or _TrainerBase), last; its other bases are
    field sets (_CriticFields, _IACFields, _IterativeFields), never a second trainer config."""
    import coopflow.schemas.config as C

    for cls in _trainer_classes():
        if cls is C._TrainerBase:
            continue
        trainer_bases = [b for b in cls.__bases__ if issubclass(b, C._TrainerBase)]
        assert trainer_bases == [cls.__bases__[-1]], f"{cls.__name__}{cls.__bases__}"


@pytest.mark.parametrize("field", ["value_loss_coef", "value_clip_range"])
def test_value_limits_agree_across_trainer_configs(field):
    from coopflow.schemas.config import IACConfig, MARLHFConfig, field_limits

    limits = {c.__name__: field_limits(c.model_fields[field]) for c in _trainer_classes() if field in c.model_fields}
    assert {"IACConfig", "MARLHFConfig", "MARLHFIterConfig"} <= set(limits)
    assert all(v == {"ge": 0} for v in limits.values()), limits  # the actor-critic trainers' limit
    assert getattr(MARLHFConfig(**{field: 0}), field) == getattr(IACConfig(**{field: 0}), field) == 0


def test_trainer_field_descriptions_are_one_line():
    for cls in _trainer_classes():
        for name, f in cls.model_fields.items():
            assert f.description and "\n" not in f.description, f"{cls.__name__}.{name}"


# --- MARLHF -> its RL backend's trainer config -----------------------------------------------------


_RL_COMMON = {  # the MARLHF trainer below, field by field, as its RL backend gets it
    "num_train_epochs": 20, "agent_learning_rate": 1e-4, "logging_steps": 50, "num_agents": 2,
    "parallel_training": "mp", "agent_devices": ["cpu", "cpu"], "num_generations": 3, "max_new_tokens": 256,
    "temperature": 0.6, "top_p": 0.6, "top_k": 7, "num_turns": 1, "discount": 1.0,
    "early_termination_threshold": None, "external_prompt_passthrough": False, "eval_interval": 16,
    "eval_num_samples": 4, "eval_samples_per_item": 1, "eval_batch_size": 1, "rollout_buffer_size": 2,
    "train_batch_size": 2,
    "advantage_normalization": True, "reference_kl_enabled": False, "reference_kl_coef": 0.1,
    "reference_devices": None,
}


_RL_EXTENSIONS = {  # coopflow's MAGRPO-family extensions reach a MARLHF run's RL phase as set on the MARLHF trainer
    "advantage_normalization_scope": "group", "tree_expansion": "all", "team_reward_weight": 1.0,
    "num_policy_epochs": 1, "clip_range": None, "ratio_level": "token",
}


@pytest.mark.parametrize("rl_algorithm, given, expected", [
    # the MAGRPO family also gets the MARLHF run's loss_on_padding (it was dropped before, so a run's
    # loss_on_padding: false silently trained its RL phase with the reference's padded loss)
    ("magrpo", {}, {"joint_mode": "aligned", "advantage_mode": None, "loss_on_padding": False,
                    "collaboration_mode": "decentralized", "loss_chunk_tokens": "auto", **_RL_EXTENSIONS}),
    ("maremax", {"loss_chunk_tokens": 512, "num_policy_epochs": 2, "clip_range": 0.2},
     {"joint_mode": "aligned", "advantage_mode": None, "loss_on_padding": False, "collaboration_mode": "decentralized",
      "loss_chunk_tokens": 512, **_RL_EXTENSIONS, "num_policy_epochs": 2, "clip_range": 0.2}),
    ("iac", {"use_separate_critic": True},
     {"critic_learning_rate": 1e-4, "critic_type": "v", "value_loss_coef": 0.3, "critic_value_head_hidden_dim": None,
      "critic_devices": ["cpu", "cpu"], "use_separate_critic": True, "value_clip_range": 0.2,
      "value_head_hidden_dim": None}),
    ("iac", {"use_separate_critic": False, "critic_learning_rate": 2e-5, "critic_devices": "cuda:1",
             "value_clip_range": 0.0, "value_head_hidden_dim": 16},
     {"critic_learning_rate": 2e-5, "critic_type": "v", "value_loss_coef": 0.3, "critic_value_head_hidden_dim": None,
      "critic_devices": "cuda:1", "use_separate_critic": False, "value_clip_range": 0.0,
      "value_head_hidden_dim": 16}),
    ("maac", {"critic_type": "q", "critic_value_head_hidden_dim": 32},
     {"critic_learning_rate": 1e-4, "critic_type": "q", "value_loss_coef": 0.3, "critic_value_head_hidden_dim": 32,
      "critic_devices": ["cpu", "cpu"]}),
])
def test_rl_trainer_fields_match_the_hand_listed_mapping(rl_algorithm, given, expected):
    from coopflow.schemas.config import RUN_CONFIGS, MARLHFConfig, rl_trainer_fields

    t = MARLHFConfig(rl_algorithm=rl_algorithm, agent_learning_rate=1e-4, num_generations=3, top_k=7,
                     parallel_training="mp", agent_devices=["cpu", "cpu"], value_loss_coef=0.3, loss_on_padding=False,
                     **given)
    got = rl_trainer_fields(t, rl_algorithm)
    assert got == {**_RL_COMMON, **expected}
    RUN_CONFIGS.get(rl_algorithm, RunConfig).model_fields["trainer"].annotation.model_validate(got)


def test_rl_trainer_fields_resolves_aliases():
    from coopflow.schemas.config import MARLHFConfig, rl_trainer_fields

    t = MARLHFConfig(rl_algorithm="mareforce")
    assert rl_trainer_fields(t, "mareforce") == rl_trainer_fields(t, "mareinforce") == rl_trainer_fields(t, "magrpo")


def test_data_dir_accepts_file_uris_and_refuses_object_storage(tmp_path, monkeypatch):
    from coopflow.schemas.config import data_dir_path

    cfg = validate_config({**_cfg(), "data_dir": f"file://{tmp_path}/with%20space"})
    assert cfg.resolved_data_dir() == tmp_path / "with space"
    monkeypatch.setenv("COOPFLOW_HOME", f"file://{tmp_path}/home")
    assert data_dir_path(None) == tmp_path / "home"
    with pytest.raises(ConfigError, match=r"data_dir 's3://bucket/runs': a s3:// data dir is not supported .*atomic.*set remote_store"):
        validate_config({**_cfg(), "data_dir": "s3://bucket/runs"})
    with pytest.raises(ConfigError, match=r"file:///path"):
        validate_config({**_cfg(), "data_dir": "file://otherhost/share"})
