"""The BFCL tool-use environment: call parsing, AST matching with BFCL's tolerances, the joint reward by hand."""

import importlib.util

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs import tooluse

AREA = {"name": "geo.area", "description": "Area of a rectangle.",
        "parameters": {"type": "dict", "properties": {"width": {"type": "float"}, "height": {"type": "float"},
                                                      "unit": {"type": "string"}}, "required": ["width", "height"]}}
PLAY = {"name": "spotify.play", "description": "Play an artist.",
        "parameters": {"type": "dict", "properties": {"artist": {"type": "string"}, "duration": {"type": "integer"}},
                       "required": ["artist", "duration"]}}
SIMPLE = {"category": "simple_python", "prompt": "Area of a 3 by 4.5 rectangle?", "functions": [AREA],
          "ground_truth": [{"geo.area": {"width": [3.0], "height": [4.5], "unit": ["", "m"]}}]}
PARALLEL = {"category": "parallel", "prompt": "Play Taylor Swift for 20 minutes and Maroon 5 for 15.",
            "functions": [PLAY], "ground_truth": [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
                                                  {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}}]}


def test_parse_calls_reads_lines_lists_fences_and_positional_arguments():
    calls, bad = tooluse.parse_calls("```python\ngeo.area(width=3, height=4.5)\n```\nignored")
    assert calls == [("geo.area", {"width": 3, "height": 4.5})] and bad == 0
    assert tooluse.parse_calls("[f(a=1), g(b='x')]")[0] == [("f", {"a": 1}), ("g", {"b": "x"})]
    assert tooluse.parse_calls("geo.area(3, 4.5)", [AREA])[0] == [("geo.area", {"width": 3, "height": 4.5})]
    calls, bad = tooluse.parse_calls("Sure!\nf(a=1)\nf(a=some_variable)\nnot python at all (")
    assert calls == [("f", {"a": 1})] and bad == 1  # a non-literal value is unreadable, the rest still counts


def test_values_match_with_bfcl_tolerances():
    assert tooluse.value_matches("New York, NY", "new york ny") and tooluse.value_matches(3, 3.0)
    assert not tooluse.value_matches(True, 1) and not tooluse.value_matches("3", 3)
    assert tooluse.value_matches([1, "a-b"], [1, "AB"]) and not tooluse.value_matches([1], [1, 2])
    assert tooluse.value_matches({"min": 1}, {"min": [1], "max": [""]})  # an optional key may be left out
    assert not tooluse.value_matches({"min": 1, "other": 2}, {"min": [1]})


def test_call_score_by_hand():
    gt = SIMPLE["ground_truth"][0]
    assert tooluse.call_score(("geo.area", {"width": 3, "height": 4.5}), gt) == (1.0, True)  # unit may be omitted
    assert tooluse.call_score(("geo_area", {"width": 3, "height": 9}), gt) == (pytest.approx(0.5 + 0.5 * 2 / 3), False)
    # an extra argument counts against: 3 right of 3 expected + 1 extra
    assert tooluse.call_score(("geo.area", {"width": 3, "height": 4.5, "color": "red"}), gt)[0] == pytest.approx(0.875)
    assert tooluse.call_score(("other", {"width": 3}), gt) == (0.0, False)


def test_parallel_calls_match_in_any_order_and_extra_calls_cost():
    both = "spotify.play(artist='Maroon 5', duration=15)\nspotify.play(artist='taylor swift', duration=20)"
    assert tooluse.match_calls(tooluse.parse_calls(both)[0], PARALLEL["ground_truth"]) == \
        {"score": 1.0, "exact": True, "matched": 2}
    one = tooluse.match_calls(tooluse.parse_calls("spotify.play(artist='Maroon 5', duration=15)")[0],
                              PARALLEL["ground_truth"])
    assert one["score"] == 0.5 and not one["exact"]
    three = tooluse.match_calls(tooluse.parse_calls(both + "\nspotify.play(artist='x', duration=1)")[0],
                                PARALLEL["ground_truth"])
    assert three["score"] == pytest.approx((1 + 1 + 0) / 3) and not three["exact"]
    same = [("spotify.play", {"artist": "Maroon 5", "duration": 15})] * 12
    assert tooluse.match_calls(same, PARALLEL["ground_truth"])["score"] == pytest.approx((1 + 0.5) / 12)  # one-to-one
    many = tooluse.match_calls(same, PARALLEL["ground_truth"] * 2)  # 12P4 > 5040 assignments: greedy
    assert many == {"score": pytest.approx((1 + 1 + 0.5 + 0.5) / 12), "exact": False, "matched": 2}


def test_joint_reward_is_plan_f1_and_calls_by_hand():
    calls = "spotify.play(artist='Taylor Swift', duration=20)"
    # plan names the function once of twice: precision 1, recall 1/2 -> F1 2/3; the calls score 0.5
    assert tooluse.bfcl_reward(["spotify.play"], [calls], batch_items=[PARALLEL]) == \
        [pytest.approx(0.2 * (2 / 3) + 0.8 * 0.5)]
    assert tooluse.bfcl_reward(["spotify.play\nspotify.play"], [calls], batch_items=[PARALLEL]) == \
        [pytest.approx(0.2 + 0.4)]
    assert tooluse.bfcl_reward([calls], batch_items=[PARALLEL]) == [0.5]  # one agent: the calls alone
    assert tooluse.bfcl_reward(["I would call nothing"], ["no calls here"], batch_items=[SIMPLE]) == [0.0]


def test_eval_hooks_need_the_items_and_report_accuracy_per_category():
    detailed = tooluse.eval_logger([[["geo.area"], ["x"]], [["geo.area(width=3, height=4.5)"], ["nothing"]]],
                                   items=[SIMPLE, PARALLEL])
    m = tooluse.eval_aggregator(detailed)
    assert m["bfcl/exact_rate"] == 0.5 and m["bfcl/simple_python/exact_rate"] == 1.0
    assert m["bfcl/parallel/exact_rate"] == 0.0 and m["bfcl/plan_f1_mean"] == 0.5


BFCL = importlib.util.find_spec("bfcl_eval") is not None


@pytest.mark.skipif(not BFCL, reason="pip install --no-deps bfcl-eval (.ci/run does)")
def test_bundled_bfcl_data_and_its_answers_score_exact():
    """The four categories interleaved (800 train / 200 eval); an answer written from each task's first
    possible values is exact (dict-valued arguments aside, which this writer does not build)."""
    s = tooluse.bfcl_source("")[1]()
    assert (len(s["train"]), len(s["eval"])) == (800, 200)
    assert [it["category"] for it in s["train"][:3]] == ["multiple", "parallel", "parallel_multiple"]
    exact = total = 0
    for it in s["train"][:200]:
        if any(isinstance(v[0], dict) for g in it["ground_truth"] for v in next(iter(g.values())).values() if v):
            continue
        answer = "\n".join(f"{n}(" + ", ".join(f"{k}={v[0]!r}" for k, v in ps.items() if v[0] != "") + ")"
                           for g in it["ground_truth"] for n, ps in g.items())
        total += 1
        exact += tooluse.score_answer(it, answer)["exact"]
    assert total > 150 and exact == total
    with pytest.raises(ValueError, match="unknown BFCL category 'live_simple'"):
        tooluse.bfcl_source("simple_python,live_simple")


@pytest.mark.skipif(not BFCL, reason="pip install --no-deps bfcl-eval (.ci/run does)")
def test_shipped_config_runs_end_to_end_on_the_tiny_model(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = load_config("configs/magrpo-bfcl.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "agents.prompt_overflow": "truncate",  # the tiny model's context (1024) is shorter than these prompts
        "taskset.num_items": 2, "taskset.num_eval_items": 2,
        "formatters": [{"function": "coopflow.envs.tooluse:planner_prompt"},
                       {"function": "coopflow.envs.tooluse:executor_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * 4 and {"eval/bfcl/exact_rate", "eval/bfcl/plan_f1_mean"} <= set(s["eval"])
