"""Keys see code: an edit of the user's code (or coopflow's) recomputes exactly what depends on it.

The user iterates on a task of their own, a package `mypkg` on the path (formatter, reward with a helper in the
same module and one in another module, transition, evaluation hooks). Each edit must change the keys of the kinds
computed by the edited code (and, through the chained keys, what follows them), and no other key; an edit of
comments, docstrings or formatting changes no key. A full run shows the cache: a comment edit reruns nothing, a
formatter edit regenerates.
"""

import importlib
import sys
from pathlib import Path

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.common import code_identity as CI
from tests.conftest import small_config
from tests.test_key_inputs import run_keys

TASK = '''\
"""A user's reward, with a helper here and one in another module."""
from mypkg import helpers


def _score(a, b):
    return helpers.ratio(a, b)


def reward(c1, c2):
    return [_score(a, b) for a, b in zip(c1, c2)]
'''

PROMPTS = '''\
def fmt(item):
    return "Write about " + item["prompt"]


def transition(*, prompt, agent_completions, num_agents, **_):
    return [prompt + " Revise." for _ in range(num_agents)]
'''

HOOKS = '''\
def logger(agent_completions_turns, test_cases, entry_points, prompts):
    return [{"n": len(prompts)}]


def aggregator(detailed, num_turns):
    return {"turn_1/items": float(len(detailed))}
'''

HELPERS = '''\
def ratio(a, b):
    return min(len(a), len(b)) / max(len(a), len(b), 1)
'''


@pytest.fixture
def mypkg(tmp_path, monkeypatch):
    """The user's package on sys.path; yields an `edit(module, old, new)` that edits a file and reloads it (a new
    process would import the edited file; this one reloads it)."""
    root = tmp_path / "src"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "task.py").write_text(TASK)
    (root / "mypkg" / "helpers.py").write_text(HELPERS)
    (root / "mypkg" / "prompts.py").write_text(PROMPTS)
    (root / "mypkg" / "hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]
    for name in ("task", "prompts", "hooks"):
        importlib.import_module(f"mypkg.{name}")

    def edit(module: str, old: str, new: str) -> None:
        path = root / "mypkg" / f"{module}.py"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        importlib.reload(sys.modules[f"mypkg.{module}"])

    yield edit
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]


def _config(tmp_path, multi_turn: bool = False):
    extra = {"trainer": {"num_turns": 2}, "transition": {"name": "mypkg.prompts:transition"}} if multi_turn else {}
    return validate_config(small_config(tmp_path / "data", reward={"name": "mypkg.task:reward"},
                                        formatters={"function": "mypkg.prompts:fmt"}, eval_logger="mypkg.hooks:logger",
                                        eval_aggregator="mypkg.hooks:aggregator", **extra))


def _changed(tmp_path, edit, *args, multi_turn: bool = False) -> set[str]:
    """The kinds whose keys an edit changes (keys computed by the real key functions before and after)."""
    cfg = _config(tmp_path, multi_turn)
    store = ArtifactStore.of(cfg)
    before = run_keys(cfg, store)
    edit(*args)
    after = run_keys(cfg, store)
    return {k for k in before if before[k] != after[k]}


ALL_AFTER_SCORES = {"scores", "advantages", "policy", "plan", "metrics", "eval"}
"""A scoring change: the rollouts of the first update are reused, everything from its scores on is new."""


# --- the identity of a callable ------------------------------------------------------------------------


def test_identity_covers_the_module_and_the_users_package_not_comments(mypkg):
    from mypkg import task

    first = CI.callable_identity(task.reward)
    closure = CI.module_closure(["mypkg.task"])
    assert {"mypkg", "mypkg.task", "mypkg.helpers"} <= set(closure)
    mypkg("task", "def _score(a, b):\n", "def _score(a, b):  # the helper\n    # (a comment)\n\n")
    mypkg("task", '"""A user\'s reward', '"""Another docstring for the reward')
    assert CI.callable_identity(task.reward) == first  # comments, blank lines, docstrings: no change
    mypkg("helpers", "max(len(a), len(b), 1)", "max(len(a), len(b), 2)")
    second = CI.callable_identity(task.reward)
    assert second != first  # a helper in another module of the package
    mypkg("task", "return [_score(a, b)", "return [2 * _score(a, b)")
    assert CI.callable_identity(task.reward) != second  # the reward itself


def test_installed_distributions_count_by_version_the_standard_library_not_at_all(tmp_path, monkeypatch):
    (tmp_path / "uses_yaml.py").write_text("import json\nimport yaml\n\ndef f(x):\n    return yaml.safe_dump(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    closure = CI.module_closure(["uses_yaml"])
    assert closure.pop("uses_yaml") and not any("json" in k for k in closure)
    assert list(closure) == [f"dist:PyYAML=={importlib.metadata.version('PyYAML')}"]


def test_a_module_edited_after_import_is_refused_until_reloaded(mypkg, tmp_path):
    from mypkg import prompts

    CI.callable_identity(prompts.fmt)
    path = tmp_path / "src" / "mypkg" / "prompts.py"
    path.write_text(path.read_text().replace('"Write about "', '"Describe "'))  # edited, not re-imported
    with pytest.raises(CI.StaleModuleError, match="mypkg.prompts was edited after this process imported it"):
        CI.callable_identity(prompts.fmt)
    importlib.reload(prompts)
    CI.callable_identity(prompts.fmt)


def test_one_plan_sees_one_state_of_the_code(mypkg, tmp_path):
    """Inside `planning()` (one run's key computation) a closure is checked against its files once; the next plan
    sees an edit."""
    from mypkg import task

    helpers = tmp_path / "src" / "mypkg" / "helpers.py"
    with CI.planning():
        first = CI.callable_identity(task.reward)
        helpers.write_text(helpers.read_text().replace("1)", "3)"))
        assert CI.callable_identity(task.reward) == first
    importlib.reload(sys.modules["mypkg.helpers"])
    assert CI.callable_identity(task.reward) != first


# --- which keys each edit changes ------------------------------------------------------------------------


def test_a_formatter_edit_resamples_from_the_first_update(mypkg, tmp_path):
    changed = _changed(tmp_path, mypkg, "prompts", 'return "Write about "', 'return "Describe in detail "')
    assert changed == {"rollouts"} | ALL_AFTER_SCORES


def test_a_reward_helper_edit_rescores_without_resampling(mypkg, tmp_path):
    assert _changed(tmp_path, mypkg, "task", "return helpers.ratio(a, b)", "return 1.0 - helpers.ratio(a, b)") \
        == ALL_AFTER_SCORES


def test_a_helper_edit_in_another_module_of_the_package_counts(mypkg, tmp_path):
    assert _changed(tmp_path, mypkg, "helpers", "max(len(a), len(b), 1)", "max(len(a), len(b), 2)") \
        == ALL_AFTER_SCORES


def test_a_transition_edit_resamples_a_multi_turn_run(mypkg, tmp_path):
    changed = _changed(tmp_path, mypkg, "prompts", '" Revise."', '" Revise it."', multi_turn=True)
    assert changed == {"rollouts", "episode"} | ALL_AFTER_SCORES


def test_an_eval_logger_edit_recomputes_only_the_logged_metrics(mypkg, tmp_path):
    assert _changed(tmp_path, mypkg, "hooks", "len(prompts)", "len(prompts) + 1") == {"metrics"}


def test_a_comment_edit_changes_no_key(mypkg, tmp_path):
    assert _changed(tmp_path, mypkg, "prompts", "def fmt(item):\n", "def fmt(item):\n    # prompts start here\n") \
        == set()


def test_an_edit_of_a_coopflow_stage_changes_the_kinds_it_computes(tmp_path, monkeypatch):
    """coopflow's own code: an edit of the advantages stage keeps the first rollouts and scores, an edit of the
    decoder resamples, an edit of the taskset builder rebuilds the taskset, whose unchanged items then reuse the
    rest (simulated on the bytes the digest reads,
    with the imported-module check off: the running code is not what is being tested)."""
    import coopflow.stages.agents.decode as decode
    import coopflow.stages.score.advantages as advantages
    import coopflow.stages.tasks.taskset as taskset

    cfg = validate_config(small_config(tmp_path / "data"))
    store = ArtifactStore.of(cfg)
    base = run_keys(cfg, store)
    real_read = CI._read
    monkeypatch.setattr(CI, "_check_loaded", lambda name, digest: None)
    expected = {advantages: {"advantages", "policy", "plan", "metrics", "eval"},
                decode: {"rollouts", "scores", "advantages", "policy", "plan", "metrics", "eval"},
                taskset: {"taskset"}}  # (later keys hold the items' digest: the same items reuse the rest)
    for module, kinds in expected.items():
        edited = str(Path(module.__file__).resolve())
        monkeypatch.setattr(CI, "_read", lambda p, e=edited: real_read(p) + (b"\n_edited = 1\n" if p == e else b""))
        monkeypatch.setattr(CI, "_CLOSURES", {})  # (the files' stats did not change: drop the memo)
        after = run_keys(cfg, store)
        assert {k for k in base if base[k] != after[k]} == kinds, module.__name__
    monkeypatch.setattr(CI, "_read", lambda p: real_read(p) + b"\n# a comment\n")
    monkeypatch.setattr(CI, "_CLOSURES", {})
    assert run_keys(cfg, store) == base


# --- a run: the cache follows the code ------------------------------------------------------------------


@pytest.mark.slow
def test_a_rerun_after_an_edit_recomputes_exactly_what_depends_on_it(mypkg, tmp_path, pinned_threads):
    from coopflow.flows.driver import inline_runner, run

    cfg = _config(tmp_path).model_copy(update={"eval_before": False})
    first = run(cfg, inline_runner())
    assert first["executed"].get("generate")
    mypkg("prompts", "def fmt(item):\n", "def fmt(item):\n    # only a comment\n")
    assert run(cfg, inline_runner())["executed"] == {}
    mypkg("task", "return helpers.ratio(a, b)", "return 1.0 - helpers.ratio(a, b)")
    rescored = run(cfg, inline_runner())["executed"]
    assert rescored.get("score") and rescored.get("evaluate")
    assert rescored["generate"] < first["executed"]["generate"]  # the first update's rollouts are reused
    mypkg("prompts", 'return "Write about "', 'return "Describe in detail "')
    resampled = run(cfg, inline_runner())["executed"]
    assert resampled["generate"] == first["executed"]["generate"] and resampled.get("evaluate")


def test_parsing_survives_a_collection_that_parses_midway(tmp_path):
    """CPython 3.11 keeps one AST-conversion counter per interpreter: a garbage collection during a conversion that
    runs a parse (a callback here; Prefect's heartbeat thread in a deployed run) made `ast.parse` fail with
    "AST constructor recursion depth mismatch". coopflow's parses (code identity, the coding environments) hold the
    collector off while they convert."""
    import ast
    import gc
    import hashlib

    from coopflow.stages.common.syntax import parse

    source = Path(ast.__file__).read_text()  # a big module: many allocations, many chances for a collection
    target = tmp_path / "big.py"
    target.write_text(source + f"\n# {target}\n")  # bytes of its own: not a parse cached by content

    def deeper(n: int) -> None:  # the nested parse starts 3·n levels deeper than any node of the outer one:
        if n:                     # it always leaves the shared counter where the outer conversion does not expect it
            return deeper(n - 1)
        ast.parse("x = (1, 2)")

    def parse_on_collection(phase, info):
        if phase == "start":
            deeper(40)

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.callbacks.append(parse_on_collection)
    gc.set_threshold(50)
    gc.enable()
    try:
        if sys.version_info < (3, 13):  # the hazard is real on this interpreter (fixed upstream in 3.13)
            with pytest.raises(SystemError, match="recursion depth mismatch"):
                ast.parse(source)
        tree = parse(source)
        digest, _ = CI._parse(str(target))
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(parse_on_collection)
        if not enabled:
            gc.disable()
    assert ast.dump(tree) == ast.dump(ast.parse(source))
    assert len(digest) == 16 and digest != hashlib.sha256(target.read_bytes()).hexdigest()[:16]  # parsed, not raw
