"""Cache keys come from declared inputs, and no setting that changes an artifact is missing from its key.

- every field of every config model is classified: an input of some artifact kind (`INPUTS`) or listed in
  `NO_EFFECT` with a reason (a new field fails here until someone decides which artifacts it changes);
- changing an input changes the keys of its kinds, as the real key functions compute them; changing a
  no-effect field changes no key (caches stay shared);
- tiny runs: a run with any one setting changed stores, under every key it shares with the baseline run,
  exactly the content the baseline stored (same key => same content: no stale hit), and the stale-metrics
  case (a rerun with other logging_steps was served the first run's metrics) stays fixed.
"""

import copy
import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from coopflow.artifacts import ArtifactStore
from coopflow.schemas import config as C
from coopflow.schemas.config import validate_config
from coopflow.stages.planning.inputs import INPUTS, NO_EFFECT, NOT_READ, covers, declared_values, kinds_of
from tests.conftest import small_config

RUN_CONFIGS = [C.RunConfig, *C.RUN_CONFIGS.values()]


# --- walking the config models ------------------------------------------------------------------------


def _submodel(annotation) -> type[BaseModel] | None:
    for a in (typing.get_args(annotation) or (annotation,)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
        inner = _submodel(a) if typing.get_args(a) else None
        if inner is not None:
            return inner
    return None


def field_paths(cls: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """Every leaf field of a config model (sections walked into) -> its FieldInfo."""
    out = {}
    for name, f in cls.model_fields.items():
        sub = _submodel(f.annotation)
        if sub is not None:
            out.update(field_paths(sub, f"{prefix}{name}."))
        else:
            out[prefix + name] = f
    return out


ALL_FIELDS: dict[str, object] = {}
for _cls in RUN_CONFIGS:
    ALL_FIELDS.update(field_paths(_cls))


SEGMENT_KINDS = ("taskset", "start", "plan", "rollouts", "episode", "scores", "advantages", "ac_samples", "policy", "metrics",
                 "eval", "critic")
KINDS_OF = {
    "RunConfig": SEGMENT_KINDS, "IACRunConfig": SEGMENT_KINDS, "MAACRunConfig": SEGMENT_KINDS,
    "MADPORunConfig": ("taskset", "start", "candidates", "scores", "pairs", "dpo", "metrics", "eval"),
    "MARLHFRunConfig": ("candidates", "pairs", "reward_model", "rl_phase") + SEGMENT_KINDS,
    "MADPOIterRunConfig": ("taskset", "start", "plan", "round"),
    "MARLHFIterRunConfig": ("taskset", "start", "plan", "round", "reward_model", "rl_phase"),
}
"""The artifact kinds each algorithm's run stores (a field must be an input of one of its own run's kinds)."""


def _declared(path: str, kinds_of_run=None) -> list[str]:
    """The kinds whose inputs cover `path` (of the kinds `kinds_of_run`, when given)."""
    return [k for k in kinds_of(path) if kinds_of_run is None or k in kinds_of_run]


def test_every_config_field_is_an_input_or_has_no_effect():
    assert len(ALL_FIELDS) > 120 and set(KINDS_OF) == {c.__name__ for c in RUN_CONFIGS}
    algorithm = {"MADPORunConfig": "madpo", "MARLHFRunConfig": "marlhf"}
    unclassified = sorted({f"{p} ({cls.__name__})" for cls in RUN_CONFIGS for p in field_paths(cls)
                           if not _declared(p, KINDS_OF[cls.__name__]) and p not in NO_EFFECT
                           and p not in NOT_READ.get(algorithm.get(cls.__name__), ((), ""))[0]})
    assert unclassified == [], f"declare these in coopflow.stages.planning.inputs (INPUTS or NO_EFFECT): {unclassified}"
    both = [p for p in NO_EFFECT if _declared(p) and not all(k in ("round",) for k in _declared(p))]
    assert both == [], f"listed as no-effect but declared as inputs: {both}"
    names = [p.lstrip("-") for paths in INPUTS.values() for p in paths] + list(NO_EFFECT)
    stale = [p for p in names if not any(covers(p, f) for f in ALL_FIELDS)]
    assert stale == [], f"declarations naming no config field: {stale}"
    assert all(reason.strip() for reason in NO_EFFECT.values())


# --- one other valid value per field --------------------------------------------------------------------

ALTERNATIVES: dict[str, object] = {
    "agents.agent_model": None,  # set per config below (another tiny-model build is the cheap alternative)
    "env": "story",  # the parts the base config writes out: the same run, so no key may change
    "agents.attn_implementation": "eager",
    "agents.device": "cpu:0",
    "agents.compute_dtype": "bfloat16",
    "agents.dtype": "bfloat16",
    "agents.lora.target_modules": ["q_proj", "v_proj"],
    "formatters.template": "Say: {prompt}",
    "formatters.system_prompt": "You are agent one.",
    "formatters.function": "coopflow.envs.writing:eval_logger",  # any importable callable names another formatter
    "reward.name": "coopflow.envs.writing:dual_length_reward",
    "reward.kwargs": {"lo": 1.5},
    "reward.processor": "clamp:0:1",
    "reward.reward_range": [0.0, 1.0],
    "reward.executor_address": "tcp://127.0.0.1:1",
    "trainer.reward_model_device": "cpu",
    "trainer.policy_checkpoint_dir": "/tmp/coopflow-key-test-export",
    "trainer.preference_replay_dir": "/tmp/coopflow-key-test-export",
    "ray.address": "ray://127.0.0.1:1",
    "ray.object_store_mb": 128,
    "centralized_adapter": "coopflow.centralized:DelimitedAdapter",
    "centralized_adapter_kwargs": {"separator": "\n---\n"},
    "taskset.eval_split": "train",
    "transition.name": "feedback",
    "transition.kwargs": {"instruction": "Try again."},
    "metrics_callback": "coopflow.envs.writing:length_metrics",
    "eval_logger": "coopflow.envs.writing:eval_logger",
    "eval_aggregator": "coopflow.envs.writing:eval_aggregator",
    "taskset.name": "tldr-mini",
    "taskset.split": "eval",
    "taskset.prompt_template": "{prompt}!",
    "taskset.prompt_column": "topic",
    "tracking.experiment": "other",
    "tracking.run_name": "other",
    "tracking.tracking_uri": "sqlite:////tmp/other-mlflow.db",
    "data_dir": None,  # set per test (another temp dir)
    "remote_store": "memory://other",
    "remote_store_options": {"anon": True},
    "cache_salt": "fresh",
    "trainer.advantage_mode": "max",
    "trainer.joint_mode": "cross",
    "trainer.collaboration_mode": "centralized",
    "trainer.parallel_training": "mp",
    "trainer.agent_devices": ["cpu", "cpu"],
    "trainer.critic_devices": ["cpu", "cpu"],
    "trainer.reference_devices": ["cpu"],
}


def _alternative(path: str, f, current):
    if path in ALTERNATIVES:
        return ALTERNATIVES[path]
    ann = f.annotation
    args = [ann] if typing.get_origin(ann) is typing.Literal else \
        [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
    base = args[0]
    if typing.get_origin(base) is typing.Annotated:  # a constrained number (its constraint in the metadata)
        base = typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return next(c for c in typing.get_args(base) if c != current)
    if base is bool:
        return not current
    limits = {type(m).__name__: m for m in f.metadata}
    if base is int:
        v = (current if isinstance(current, int) else 0) + 1  # (a number for a setting that is 'auto' now)
        le = getattr(limits.get("Le"), "le", None)
        return v if le is None or v <= le else current - 1
    if base is float:
        if current is None:
            return 0.5
        v = current / 2 if current else 0.5
        return v
    raise LookupError(path)


# --- the keys a config's run would use ------------------------------------------------------------------


def run_keys(cfg, store) -> dict[str, object]:
    """kind -> the key(s) of that kind the run of `cfg` computes up front (through the real key functions)."""
    from coopflow.stages.planning import keys as K
    from coopflow.stages.planning import context as PC
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.planning.plan import is_actor_critic, trains_in_segments
    from coopflow.stages.tasks.taskset import build_taskset

    taskset = build_taskset(cfg.taskset, store)
    out: dict[str, object] = {"taskset": taskset.key}
    if trains_in_segments(cfg):
        ctx = make_context(cfg, store, taskset)
        uk = K.update_keys(ctx, ctx.plan.start_key, ctx.plan.updates[0])
        signal = "ac_samples" if is_actor_critic(cfg) else "advantages"
        if ctx.episode.num_turns > 1:
            out["episode"] = uk.rollouts
        out.update(start=ctx.plan.start_key, plan=ctx.end_keys, rollouts=uk.rollouts, policy=uk.policy_after,
                   scores=K.scores_key(ctx, uk.rollouts, 0), metrics=K.segment_record_keys(ctx, 0)[1],
                   eval=K.eval_key(ctx, ctx.end_keys[-1]), **{signal: uk.advantages})
        if is_actor_critic(cfg):
            out["critic"] = K.critic_refit_key(ctx, ctx.end_keys[-1], [uk.advantages])
        ctx.session.close()
        return out
    from coopflow.stages.loops import preference as P

    if cfg.algorithm in ("madpo", "marlhf"):
        ctx = PC.preference_context(cfg, store, taskset)
        out.update(start=ctx.plan.start_key, candidates=K.candidates_key(ctx), scores=K.preference_scores_key(ctx),
                   pairs=K.pairs_key(ctx))
        if cfg.algorithm == "madpo":
            out.update(dpo=K.dpo_key(ctx), eval=K.eval_key(ctx, K.dpo_key(ctx)),
                       metrics=K.metrics_key(ctx, K.dpo_key(ctx)))
        else:
            out["reward_model"] = P.rm_key(ctx)
            rctx = make_context(PC.rl_config(cfg), store, taskset,
                                reward_override=(lambda *c, **k: [0.0], {"reward_model": out["reward_model"]}))
            out["rl_phase"] = (rctx.plan.start_key, rctx.end_keys)
            rctx.session.close()
        ctx.session.close()
        return out

    ctx = make_context(cfg, store, taskset)
    keys = K.round_keys(ctx)
    out.update(start=ctx.plan.start_key, round=keys[0], plan=tuple(keys))
    ctx.session.close()
    return out


VIEW_OF = {"online": {"start": "start", "rollouts": "rollouts", "scores": "scores", "advantages": "advantages",
                     "ac_samples": "ac_samples", "policy": "policy", "metrics": "metrics", "eval": "eval",
                     "critic": "critic"},
           "preference": {"start": "start", "candidates": "candidates", "scores": "preference_scores",
                          "pairs": "pairs", "dpo": "dpo", "metrics": "dpo_metrics", "eval": "eval",
                          "reward_model": "reward_model"},
           "iterative": {"start": "start", "round": "round"}}
"""The settings view of the stage that computes each kind `run_keys` returns."""


def stage_views(cfg) -> dict:
    """kind -> the settings view its stage reads (`stages.planning.settings`)."""
    from coopflow.stages.planning.plan import trains_in_segments
    from coopflow.stages.planning.settings import RunSettings

    settings = RunSettings.of(cfg)
    family = "online" if trains_in_segments(cfg) else "iterative" if settings.iterative else "preference"
    return {kind: settings.view(name) for kind, name in VIEW_OF[family].items()}


MODEL_SOURCES = ("critic.critic_model", "trainer.critic_model_name", "trainer.reward_model_name")
"""Model-source fields: their other value is another model directory."""

ALGORITHM_CONFIGS = {
    "magrpo": {},
    "magrpo-multiturn": {"trainer": {"num_turns": 2}, "transition": {"name": "plain"}},
    "iac": {"trainer": {"num_generations": 1, "use_separate_critic": False}},
    "maac": {"trainer": {"num_generations": 1}, "critic": {"critic_model": "tiny"}},
    "madpo": {"trainer": {"preference_num_candidates": 2}},
    "marlhf": {"trainer": {"preference_num_candidates": 2, "rl_algorithm": "maac", "num_generations": 1}},
    "madpo-iter": {"trainer": {"preference_num_candidates": 2, "num_iterations": 2}},
}
SKIP = {
    "algorithm": "chooses the config class itself (every key holds it through the start key)",
    "data_dir": "another store: nothing to compare within one",
    "agents.agent_model": "covered by the start key's source identity (tests/test_training.py)",
    "agents.agents": "covered by the start key's source identity",
    "agents.num_agents": "validated against the sources; covered by the start key's source identity",
    "trainer.num_agents": "validated equal to agents.num_agents",
    "trainer.collaboration_mode": "centralized runs validate other settings with it (tests/test_centralized.py)",
    "trainer.comparator_policy": "each comparator needs its own settings (tests/test_iterative.py)",
    "trainer.parallel_training": "mp needs agent_devices (checked with trainer.agent_devices)",
    "trainer.rl_algorithm": "each backend needs its own settings (tests/test_preference.py)",
    "trainer.use_separate_critic": "needs critic sources (checked through critic.critic_model)",
    "reward.executor": "starts a Dask or Ray cluster (tests/test_scale_out.py); an execution setting",
    "taskset.eval_fraction": "needs a source without an eval split (tests/test_taskset.py)",
    "taskset.eval_file": "needs a source without an eval split (tests/test_taskset.py)",
    "critic.critics": "the same critic sources as critic.critic_model, listed per agent (checked through that)",
    "trainer.preference_replay_mode": "validated with its k / lambda / sample size (tests/test_iterative_parts.py)",
    "trainer.preference_replay_lambda": "validated with preference_replay_mode (part of the round's trainer section)",
    "trainer.preference_replay_sample_size": "validated with preference_replay_mode (the round's trainer section)",
    "taskset.eval_split_seed": "only read with taskset.eval_fraction (tests/test_taskset.py)",
}
SKIP_PREFIXES = {"trainer.comparator_": "validated with comparator_policy; part of the round key as the trainer "
                                        "section (tests/test_iterative.py runs each comparator)"}
SKIP_FOR = {("madpo", "marlhf", "madpo-iter"): {"trainer.joint_mode": "preference learning is aligned only",
                                                "trainer.num_turns": "preference learning is single-turn only"}}
TOGETHER = {"eval_logger": {"eval_aggregator": "coopflow.envs.writing:eval_aggregator"},
            "eval_aggregator": {"eval_logger": "coopflow.envs.writing:eval_logger"},
            "trainer.num_turns": {"transition": {"name": "plain"}}}
TOGETHER_FOR = {("iac", "critic.critic_model"): {"trainer.use_separate_critic": True}}
"""Settings validated together: changing the first also sets these."""


def _base(tmp_path, name: str) -> dict:
    data = small_config(tmp_path)
    for section, values in ALGORITHM_CONFIGS[name].items():
        data.setdefault(section, {}).update(values)
    if name in ("madpo", "marlhf", "madpo-iter"):
        data["trainer"].pop("num_turns", None)
    return data


def _set(data: dict, path: str, value) -> dict:
    out = copy.deepcopy(data)
    *parents, name = path.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {}) if not isinstance(node.get(p), list) else node[p][0]
    node[name] = value
    return out


def _get(cfg, path: str):
    obj = cfg
    for name in path.split("."):
        if obj is None:
            return None
        obj = getattr(obj, name) if isinstance(obj, BaseModel) else None
    return obj


@pytest.mark.parametrize("name", list(ALGORITHM_CONFIGS))
def test_inputs_change_their_kinds_keys_and_no_effect_fields_change_none(tmp_path, name, tiny_model_dir):
    algorithm = name.split("-multiturn")[0]
    base = _base(tmp_path, name)
    cfg = validate_config(base, algorithm)
    store = ArtifactStore(tmp_path / "artifacts")
    ref = run_keys(cfg, store)
    views = stage_views(cfg)
    fields = field_paths(type(cfg))
    checked, failures = [], []
    for path, f in sorted(fields.items()):
        skip_for = {k: v for names, d in SKIP_FOR.items() if algorithm in names for k, v in d.items()}
        if path in SKIP or path in skip_for or path.startswith(("formatters.", *SKIP_PREFIXES)):
            continue
        current = _get(cfg, path)
        try:
            value = str(tiny_model_dir) if path in MODEL_SOURCES else _alternative(path, f, current)
            data = _set(base, path, value)
            together = {**TOGETHER.get(path, {}), **TOGETHER_FOR.get((algorithm, path), {})}
            for other_path, other_value in together.items():
                data = _set(data, other_path, other_value)
            if path.startswith("agents.lora."):
                data["agents"]["lora"] = {**(cfg.agents.lora.model_dump() if cfg.agents.lora else {}),
                                          path.rsplit(".", 1)[1]: value}
            other = validate_config(data, algorithm)
            keys = run_keys(other, store)
        except (LookupError, ValueError) as err:
            failures.append(f"{path}: no valid alternative value ({str(err)[:200]})")
            continue
        kinds = [k for k in _declared(path) if k in ref]
        # (a NO_EFFECT field a kind names explicitly is that kind's input: reward_range in an iterative round)
        explicit = [k for k in ref if path in INPUTS.get(k, ())]
        if (path in NO_EFFECT and not explicit) or path in NOT_READ.get(algorithm, ((), ""))[0]:
            changed = sorted(k for k in ref if keys[k] != ref[k])
            if changed:
                failures.append(f"{path} (no effect) changed the keys of {changed}")
        elif kinds:
            same = sorted(k for k in kinds if keys[k] == ref[k])
            if same:
                failures.append(f"{path} -> {value!r} left the keys of {same} unchanged (declared inputs)")
        # what a stage may read, its key holds: every field the view of a kind's stage can read changes that key
        if not explicit and (path in NO_EFFECT or path in NOT_READ.get(algorithm, ((), ""))[0]):
            checked.append(path)
            continue
        readers = [k for k in ref if k in views and views[k].reads(path)]
        same = sorted(k for k in readers if keys[k] == ref[k])
        if same:
            failures.append(f"{path} -> {value!r}: the stages of {same} may read it but their keys did not change")
        checked.append(path)
    assert not failures, "\n".join(failures)
    assert len(checked) > 30


def test_declared_values_leave_out_no_effect_fields_of_a_section(tmp_path):
    cfg = validate_config(_base(tmp_path, "madpo-iter"), "madpo-iter")
    trainer = declared_values(cfg, "round")["trainer"]
    assert "num_iterations" not in trainer and "comparator_api_key" not in trainer
    assert "parallel_training" not in trainer and trainer["dpo_beta"] == cfg.trainer.dpo_beta


# --- tiny runs: same key => same content -----------------------------------------------------------------


def _contents(store: ArtifactStore) -> dict[tuple[str, str], str]:
    """(kind, key) -> a digest of what the artifact holds (timing rows left out: wall-clock measurements)."""
    import hashlib

    out = {}
    for kind, key in store.artifacts():
        ref = store.find(kind, key)
        if ref is None:
            continue
        if ref.rows is not None:  # a table: its rows
            rows = [r for r in store.read_rows(ref) if not str(r.get("key", "")).startswith("timing/")]
            out[(kind, key)] = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
        else:  # a directory: its files' bytes
            root = store.open_dir(ref)
            h = hashlib.sha256()
            for p in sorted(p for p in root.rglob("*") if p.is_file() and p.name not in ("manifest.json", "ref.json")):
                h.update(str(p.relative_to(root)).encode())
                data = p.read_bytes()
                if p.name == "trainer_state.json":  # which run wrote it (its segmentation, for gc and rescore_from)
                    state = json.loads(data)
                    data = json.dumps({k: v for k, v in state.items() if k not in ("segment_keys", "segment_steps")},
                                      sort_keys=True).encode()
                h.update(data)
            out[(kind, key)] = h.hexdigest()
    return out


def _tiny_run(tmp: Path, data: dict, algorithm: str = "magrpo") -> dict:
    from coopflow.flows.driver import run_inline

    data = {**data, "data_dir": str(tmp)}
    cfg = validate_config(data, algorithm)
    store = ArtifactStore(tmp / "artifacts")
    run_inline(cfg)
    return _contents(store)


def _same_key_same_content(a: dict, b: dict) -> list[str]:
    return [f"{kind} {key}" for (kind, key), digest in a.items() if (kind, key) in b and b[(kind, key)] != digest
            and kind not in ("model",)]


def test_a_rerun_with_other_logging_settings_is_not_served_stale_metrics(tmp_path, pinned_threads):
    """The case that found this: metrics were stored under the checkpoint key, which held no logging setting."""
    from coopflow.flows.driver import run_inline

    data = small_config(tmp_path, trainer={"logging_steps": 1, "eval_interval": 2, "eval_num_samples": 1})
    store = ArtifactStore(tmp_path / "artifacts")
    first = run_inline(validate_config(data, "magrpo"))
    again = run_inline(validate_config(_set(data, "trainer.logging_steps", 100), "magrpo"))
    assert again["checkpoint"] == first["checkpoint"]  # the same training (replayed, nothing generated)
    assert "generate" not in again["executed"] and again["executed"].get("update", 0) > 0
    metrics = [k for kind, k in store.artifacts() if kind == "metrics"]
    assert len(metrics) == 2  # one per logging setting, both beside the same checkpoint
    rows = [[r for r in store.read_rows(store.find("metrics", k)) if not r["key"].startswith("timing/")]
            for k in metrics]
    logged = sorted(len({r["env_step"] for r in rs if r["key"].endswith("reward_mean") and "eval" not in r["key"]})
                    for rs in rows)
    assert logged[0] == 1 and logged[1] > 1  # every update logged vs only the first
    third = run_inline(validate_config(_set(data, "trainer.logging_steps", 100), "magrpo"))
    assert not {"generate", "update"} & set(third["executed"])  # now both are cached


# fields a tiny in-process run can exercise, each with its other value (cheap on 2 CPU cores)
CONTENT_CASES = [
    ("agents.attn_implementation", "eager"), ("agents.device", "cpu:0"), ("agents.decode_step", "static"), ("agents.torch_threads", 1),
    ("trainer.eval_batch_size", 4), ("reward.timeout_s", 30.0), ("reward.retries", 2),
    ("reward.reward_range", [0.0, 1.0]), ("reward.workers", 2), ("max_sequences", 100000),
    ("tracking.experiment", "other"), ("tracking.rollouts", 2), ("checkpoint_optimizer", "last"),
    ("trainer.logging_steps", 100), ("trainer.eval_interval", 2), ("trainer.eval_num_samples", 1),
    ("trainer.temperature", 0.7), ("trainer.agent_learning_rate", 1e-4), ("trainer.num_generations", 3),
    ("trainer.advantage_normalization", False), ("trainer.loss_on_padding", False), ("trainer.top_k", 5),
    ("trainer.max_new_tokens", 6), ("trainer.train_batch_size", 1), ("trainer.rollout_buffer_size", 1),
    ("trainer.num_train_epochs", 2), ("checkpoint_every", 1), ("trainer.reference_kl_enabled", True),
    ("trainer.joint_mode", "cross"), ("trainer.advantage_mode", "max"), ("seed", 1),
    ("agents.compute_dtype", "bfloat16"), ("reward.processor", "clamp:0:1"),
    ("trainer.advantage_normalization_scope", "batch"), ("trainer.num_policy_epochs", 2),
    ("trainer.clip_range", 0.1), ("trainer.ratio_level", "sequence"), ("trainer.team_reward_weight", 0.5),
    ("trainer.tree_expansion", "best"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path,value", CONTENT_CASES, ids=[c[0] for c in CONTENT_CASES])
def test_a_changed_setting_never_stores_other_content_under_a_shared_key(tmp_path, pinned_threads, path, value):
    base = small_config(tmp_path, trainer={"eval_interval": 4, "eval_num_samples": 1, "logging_steps": 2})
    a = _tiny_run(tmp_path / "a", base)
    b = _tiny_run(tmp_path / "b", _set(base, path, value))
    stale = _same_key_same_content(a, b)
    assert stale == [], f"{path}={value!r}: other content under the same key: {stale}"


AC_BASE = {"trainer": {"num_generations": 1, "use_separate_critic": True, "eval_interval": 0, "logging_steps": 2},
           "critic": {"critic_model": "tiny"}}
AC_CASES = [("trainer.critic_value_head_hidden_dim", 8), ("trainer.value_loss_coef", 0.25),
            ("trainer.critic_learning_rate", 1e-4), ("trainer.discount", 0.5)]


@pytest.mark.slow
@pytest.mark.parametrize("path,value", AC_CASES, ids=[c[0] for c in AC_CASES])
def test_an_actor_critic_setting_never_stores_other_content_under_a_shared_key(tmp_path, pinned_threads, path,
                                                                               value):
    base = small_config(tmp_path, **AC_BASE)
    a = _tiny_run(tmp_path / "a", base, "iac")
    b = _tiny_run(tmp_path / "b", _set(base, path, value), "iac")
    stale = _same_key_same_content(a, b)
    assert stale == [], f"{path}={value!r}: other content under the same key: {stale}"
