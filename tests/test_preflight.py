"""Bad input is refused before anything expensive starts, in one line naming the field or file (issue 20)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from coopflow.schemas.config import validate_config
from coopflow.stages.operations.preflight import PreflightError, preflight
from tests.conftest import small_config

REPO = Path(__file__).resolve().parents[1]


def _cfg(tmp_path, **sections):
    return validate_config(small_config(tmp_path / "data", **sections))


@pytest.mark.parametrize("make, match", [
    (lambda p: {"reward": {"name": "no_such_module:reward"}}, r"reward 'no_such_module:reward': cannot import"),
    (lambda p: {"reward": {"name": "tests.helpers:no_such_reward"}}, r"has no callable 'no_such_reward'"),
    (lambda p: {"formatters": {"function": "tests.helpers:nope"}}, r"formatters\[0\].function"),
    (lambda p: {"metrics_callback": "nowhere:fn"}, r"metrics_callback 'nowhere:fn'"),
    (lambda p: {"taskset": {"name": str(p / "missing.jsonl")}},
     r"taskset.name: .*missing.jsonl.* nor an existing file"),
])
def test_unloadable_code_and_missing_files_are_named(tmp_path, make, match):
    with pytest.raises(PreflightError, match=match):
        preflight(_cfg(tmp_path, **make(tmp_path)))


def test_taskset_contents_are_checked(tmp_path):
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text('{"text": "a"}\n')
    with pytest.raises(PreflightError,
                       match=r"taskset.prompt_column 'prompt' not found in .*row 0 \(columns: \['text'\]\)"):
        preflight(_cfg(tmp_path, taskset={"name": str(no_prompt)}))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PreflightError, match=r"split 'train' has no items"):
        preflight(_cfg(tmp_path, taskset={"name": str(empty)}))
    latin = tmp_path / "latin1.csv"
    latin.write_bytes("prompt\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(PreflightError, match=r"latin1.csv is not UTF-8 text \(byte 10"):
        preflight(_cfg(tmp_path, taskset={"name": str(latin)}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(PreflightError, match=r"bad.jsonl:2: invalid JSON line"):
        preflight(_cfg(tmp_path, taskset={"name": str(bad)}))


def test_data_dir_under_a_file_is_named(tmp_path):
    (tmp_path / "afile").write_text("x")
    cfg = validate_config(small_config(tmp_path / "afile" / "data"))
    with pytest.raises(PreflightError, match=r"data_dir .*afile/data: .*afile is a file, not a directory"):
        preflight(cfg)


def test_a_good_config_passes_and_builds_its_taskset(tmp_path):
    cfg = _cfg(tmp_path)
    preflight(cfg)
    assert any((tmp_path / "data" / "artifacts" / "taskset").iterdir())


def test_cli_refuses_bad_input_in_seconds_with_one_line(tmp_path):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config",
                        "configs/magrpo-story.yaml",
                        "--set", f"data_dir={tmp_path / 'data'}", "--set", "reward.name=no_such_module:reward"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line, no traceback
    assert "reward 'no_such_module:reward'" in r.stderr
    assert time.perf_counter() - t0 < 60  # before any Prefect server or model (~30 s otherwise)


def test_duplicate_item_ids_are_refused(tmp_path):
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n')
    with pytest.raises(PreflightError, match=r"duplicate id 'a' in rows 0 and 2"):
        preflight(_cfg(tmp_path, taskset={"name": str(dup)}))


@pytest.mark.parametrize("setup, args, match", [
    (lambda p: (p / "bad.yaml").write_text("agents:\n  num_agents: [2\n"), ["--config", "{p}/bad.yaml"],
     r"cannot parse config file .*bad.yaml:3:1: expected ',' or '\]'"),
    (lambda p: (p / "bin.yaml").write_bytes(b"agents: \xff\n"), ["--config", "{p}/bin.yaml"],
     r"config file .*bin.yaml is not UTF-8 text \(byte 8\)"),
    (None, ["--set", "trainer.nope=1"], r"trainer.nope: Extra inputs are not permitted"),
    (None, ["--set", "trainer.num_generations=abc"], r"trainer.num_generations: Input should be a valid integer"),
    (None, ["--set", "trainer.temperature=-1"], r"trainer.temperature: Input should be greater than 0"),
    (None, ["--set", "agents.agent_model={p}/no-model"], r"agents.agent_model: model directory .*no-model' does not"),
    (None, ["--set", "transition.name=nowhere:fn"], r"transition 'nowhere:fn': cannot import module 'nowhere'"),
])
def test_cli_refuses_bad_configs_with_one_line(tmp_path, setup, args, match):
    """Malformed / non-UTF-8 YAML, unknown keys, wrong types, out-of-range values, a missing model dir and an
    unimportable transition (even for a one-turn run): exit 2 with one line, before anything starts."""
    import re

    if setup:
        setup(tmp_path)
    args = [a.format(p=tmp_path) for a in args]
    if "--config" not in args:
        args = ["--config", "configs/magrpo-story.yaml", *args]
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", *args,
                        "--set", f"data_dir={tmp_path / 'data'}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert re.search(match, r.stderr), r.stderr


@pytest.mark.parametrize("rows, match", [
    ('{"prompt": "a story"}\n{"prompt": ""}\n',
     r"train row 1: agent 0's prompt is empty \(the prompt column 'prompt'\)"),
    ('{"prompt": "a story"}\n{"prompt": "  "}\n', r"train row 1: agent 0's prompt is empty"),
    ('{"prompt": "a story"}\n{"prompt": null}\n', r"train row 1: taskset.prompt_column 'prompt' holds null, not text"),
    ('{"prompt": "a story"}\n{"prompt": 7}\n', r"train row 1: taskset.prompt_column 'prompt' holds int 7, not text"),
    ('{"prompt": "a story"}\n{"prompt": "x"\n', r"rows.jsonl:2: invalid JSON line"),
])
def test_taskset_rows_are_checked_before_a_run_starts(tmp_path, rows, match):
    """Empty, blank, null or non-string prompts and unreadable lines: one line naming the taskset and row, exit 2,
    before a Prefect server or a model starts (the run used to fail mid-evaluation, three tracebacks later)."""
    import re

    (tmp_path / "rows.jsonl").write_text(rows)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "run", "train-magrpo", "--config",
                        "configs/magrpo-story.yaml", "--set", f"taskset.name={tmp_path / 'rows.jsonl'}",
                        "--set", "taskset.num_eval_items=1", "--set", f"data_dir={tmp_path / 'data'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and re.search(match, r.stderr), r.stderr
    assert "rows.jsonl" in r.stderr
    assert time.perf_counter() - t0 < 60


def test_a_formatter_that_leaves_an_agent_without_text_is_refused(tmp_path):
    cfg = _cfg(tmp_path, formatters=[{"template": "{prompt}"}, {"template": "{topic}"}])
    preflight(cfg)  # every story row has a topic
    empty = tmp_path / "t.jsonl"
    empty.write_text('{"prompt": "a story", "topic": "owls"}\n{"prompt": "another", "topic": ""}\n')
    with pytest.raises(PreflightError, match=r"'.*t.jsonl' train row 1: agent 1's prompt is empty \(\{topic\}\)"):
        preflight(_cfg(tmp_path, taskset={"name": str(empty)}, formatters=[{"template": "{prompt}"},
                                                                             {"template": "{topic}"}]))


def test_rows_missing_a_field_the_reward_reads_are_refused(tmp_path):
    rows = tmp_path / "he.jsonl"
    rows.write_text('{"prompt": "def f():", "test": "assert True", "entry_point": "f"}\n'
                    '{"prompt": "def g():", "entry_point": "g"}\n')
    with pytest.raises(PreflightError, match=r"he.jsonl' train row 1: no 'test' field, which reward "
                                             r"'coopflow.envs.coding:humaneval_reward' reads"):
        preflight(_cfg(tmp_path, taskset={"name": str(rows)}, reward={"name": "coopflow.envs.coding:humaneval_reward"}))


def test_require_isolation_refuses_a_machine_with_only_the_python_guard(tmp_path, monkeypatch):
    import coopflow.stages.common.sandbox as S

    monkeypatch.setattr(S.Isolation, "detect", staticmethod(lambda: S.Isolation(sys.executable, False)))
    with pytest.raises(PreflightError, match=r"sandbox.require_isolation: this machine allows no OS-level isolation"):
        preflight(_cfg(tmp_path, sandbox={"require_isolation": True}))
    preflight(_cfg(tmp_path))  # not required: the run goes ahead (the sandbox warns once when it runs programs)
    monkeypatch.setattr(S.Isolation, "detect", staticmethod(lambda: S.Isolation(sys.executable, False, True)))
    preflight(_cfg(tmp_path, sandbox={"require_isolation": True}))


# --- every entry point: the pre-flight runs inside the driver ---------------------------------------------------


def _no_model_loads(monkeypatch):
    """Fail the test if anything loads a model (the refusal must come first)."""
    import coopflow.stages.agents.models as M

    def refuse(*a, **k):
        raise AssertionError("a model loaded before the pre-flight refused the run")

    monkeypatch.setattr(M, "load_policies", refuse)


def test_the_python_api_and_the_inline_driver_refuse_bad_rows_before_a_model_loads(tmp_path, monkeypatch):
    from datasets import Dataset

    from coopflow.flows.driver import run_inline
    from coopflow.rewards import length_ratio
    from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    _no_model_loads(monkeypatch)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a story"}\n{"prompt": ""}\n')
    with pytest.raises(PreflightError, match=r"train row 1: agent 0's prompt is empty"):
        run_inline(_cfg(tmp_path, taskset={"name": str(rows), "num_eval_items": 1}))
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=2, max_new_tokens=4, rollout_buffer_size=2,
                        eval_interval=0, eval_num_samples=1)
    trainer = MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=length_ratio, args=args,
                            train_dataset=Dataset.from_dict({"prompt": ["a story", ""]}),
                            data_dir=str(tmp_path / "api"))
    with pytest.raises(PreflightError, match=r"row 1: agent 0's prompt is empty"):
        trainer.train(show_progress=False)
    with pytest.raises(PreflightError, match=r"row 1: agent 0's prompt is empty"):
        trainer.evaluate()


def test_require_isolation_is_enforced_by_the_driver_not_only_the_cli(tmp_path, monkeypatch):
    import coopflow.stages.common.sandbox as S
    from coopflow.flows.driver import run_inline

    _no_model_loads(monkeypatch)
    monkeypatch.setattr(S.Isolation, "detect", staticmethod(lambda: S.Isolation(sys.executable, False)))
    with pytest.raises(PreflightError, match=r"sandbox.require_isolation"):
        run_inline(_cfg(tmp_path, sandbox={"require_isolation": True}))


@pytest.mark.slow
def test_a_deployment_flow_refuses_bad_rows_in_one_line(tmp_path, monkeypatch, prefect_harness):
    """`train_magrpo(config_path=...)`, what a deployment runs: the pre-flight's one line, not a traceback from inside
    generation."""
    from coopflow.flows.train import train_magrpo

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a story"}\n{"prompt": ""}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text((REPO / "configs" / "magrpo-story.yaml").read_text())
    with pytest.raises(PreflightError, match=r"train row 1: agent 0's prompt is empty"):
        train_magrpo(config_path=str(cfg), overrides=[f"taskset.name={rows}", "taskset.num_eval_items=1",
                                                       f"data_dir={tmp_path / 'data'}"])
