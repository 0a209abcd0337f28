"""Built-in reward, CoMLRL 1.4.3's reward-call dispatch and reward processors."""

import math
import re

import pytest
import torch

from coopflow.stages.score.rewards import BUILTIN_REWARDS, RewardCaller, length_ratio, resolve_processor, resolve_reward, to_floats
from coopflow.stages.common.user_code import load_callable

# --- length_ratio ----------------------------------------------------------------------------------


@pytest.mark.parametrize("c1, c2, expected", [
    ("ab", "abcde", 1.0),                 # ratio 2.5 (inside [2, 3])
    ("ab", "abcd", 1.0),                  # ratio 2 (lower bound included)
    ("ab", "abcdef", 1.0),                # ratio 3 (upper bound included)
    ("abcd", "abcd", math.exp(-1)),       # ratio 1: distance 1 below
    ("ab", "abcdefgh", math.exp(-1)),     # ratio 4: distance 1 above
    ("abcd", "", math.exp(-2)),           # ratio 0: distance 2
    ("ab", "a" * 11, math.exp(-2.5)),     # ratio 5.5: distance 2.5
    ("", "anything", 0.0),                # empty agent-1 text
    ("", "", 0.0),
])
def test_length_ratio_values(c1, c2, expected):
    assert length_ratio([c1], [c2]) == pytest.approx([expected], abs=1e-12)


def test_length_ratio_batch_and_bounds():
    assert length_ratio(["ab", "abcd", ""], ["abcde", "abcd", "x"]) == pytest.approx([1.0, math.exp(-1), 0.0])
    assert length_ratio(["ab"], ["ab"], lo=1.0, hi=1.5) == [1.0]
    assert length_ratio(["ab"], ["abcd"], lo=1.0, hi=1.5) == pytest.approx([math.exp(-0.5)])
    assert length_ratio.reward_range == (0.0, 1.0)
    assert BUILTIN_REWARDS["length_ratio"] is length_ratio


def test_resolve_reward_builtin_and_kwargs():
    assert resolve_reward("length_ratio") is length_ratio
    fn = resolve_reward("length_ratio", {"lo": 1.0, "hi": 1.5})
    assert fn(["ab"], ["ab"]) == [1.0]
    # kwargs-bound reward keeps the 2-positional dispatch
    assert RewardCaller(fn, 2)([["ab"], ["abc"]], ["p"], [{}]) == [1.0]
    assert resolve_reward("math:hypot")(3.0, 4.0) == 5.0


# --- RewardCaller dispatch -------------------------------------------------------------------------

PER_AGENT = [["a"], ["bb"]]
PROMPTS = ["the prompt"]
ITEMS = [{"prompt": "the prompt", "id": 1}]


def test_n_positional_gets_per_agent_lists():
    calls = []

    def f(c1, c2):
        calls.append((c1, c2))
        return [0.25]

    assert RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS) == [0.25]
    assert calls == [(["a"], ["bb"])]


def test_n_plus_one_positional_gets_prompts_first():
    calls = []

    def f(prompts, c1, c2):
        calls.append((prompts, c1, c2))
        return [1.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [(["the prompt"], ["a"], ["bb"])]


def test_three_agents_n_plus_one_positional():
    calls = []

    def f(prompts, c1, c2, c3):
        calls.append((prompts, c1, c2, c3))
        return [1.0]

    RewardCaller(f, 3)([["a"], ["b"], ["c"]], PROMPTS, ITEMS)
    assert calls == [(["the prompt"], ["a"], ["b"], ["c"])]


def test_one_positional_gets_list_of_per_agent_lists():
    calls = []

    def f(completions):
        calls.append(completions)
        return [2.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [[["a"], ["bb"]]]


def test_varargs_gets_per_agent_lists():
    calls = []

    def f(*args):
        calls.append(args)
        return [3.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [(["a"], ["bb"])]


def test_other_positional_count_gets_per_agent_lists():
    calls = []

    def f(x, y, z, w=None):  # 3 required positionals with N=3 -> per-agent lists
        calls.append((x, y, z, w))
        return [1.0]

    RewardCaller(f, 3)([["a"], ["b"], ["c"]], PROMPTS, ITEMS)
    assert calls == [(["a"], ["b"], ["c"], None)]


def test_batch_items_and_prompts_keywords_when_declared():
    calls = []

    def f(c1, c2, batch_items=None, prompts=None):
        calls.append((batch_items, prompts))
        return [1.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [(ITEMS, PROMPTS)]


def test_only_batch_items_declared():
    calls = []

    def f(c1, c2, batch_items=None):
        calls.append(batch_items)
        return [1.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [ITEMS]


def test_kwargs_gets_both_keywords():
    calls = []

    def f(c1, c2, **kw):
        calls.append(kw)
        return [1.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [{"batch_items": ITEMS, "prompts": PROMPTS}]


def test_kwargs_with_positional_prompts_not_passed_twice():
    calls = []

    def f(prompts, c1, c2, **kw):
        calls.append((prompts, kw))
        return [1.0]

    RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert calls == [(PROMPTS, {"batch_items": ITEMS})]


def test_no_keywords_when_not_declared():
    calls = []

    def f(c1, c2, scale=1.0):
        calls.append(scale)
        return [scale]

    assert RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS) == [1.0]
    assert calls == [1.0]


def test_type_error_falls_back_to_per_agent_lists():
    calls = []

    def f(a, b=None):  # 1 required positional -> first called with one list; it refuses that
        calls.append((a, b))
        if b is None:
            raise TypeError("want two lists")
        return [5.0]

    assert RewardCaller(f, 2)(PER_AGENT, PROMPTS, ITEMS) == [5.0]
    assert calls == [([["a"], ["bb"]], None), (["a"], ["bb"])]


def test_single_agent_forms():
    calls = []

    def one(c):
        calls.append(("one", c))
        return 1.0

    def two(prompts, c):
        calls.append(("two", prompts, c))
        return 2.0

    def star(*args):
        calls.append(("star", args))
        return 3.0

    assert RewardCaller(one, 1)([["x"]], PROMPTS, ITEMS) == [1.0]
    assert RewardCaller(two, 1)([["x"]], PROMPTS, ITEMS) == [2.0]
    assert RewardCaller(star, 1)([["x"]], PROMPTS, ITEMS) == [3.0]
    assert calls == [("one", ["x"]), ("two", PROMPTS, ["x"]), ("star", (["x"],))]


def test_single_agent_prompts_keyword():
    calls = []

    def f(c, prompts=None, batch_items=None):
        calls.append((c, prompts, batch_items))
        return [0.0]

    RewardCaller(f, 1)([["x"]], PROMPTS, ITEMS)
    assert calls == [(["x"], PROMPTS, ITEMS)]


@pytest.mark.parametrize("ret, expected", [
    (torch.tensor([0.5, 1.5]), [0.5, 1.5]),
    (torch.tensor(0.75), [0.75]),
    (torch.tensor([[2.0]], requires_grad=True), [2.0]),
    ((1, 2.5), [1.0, 2.5]),
    ([3], [3.0]),
    (4, [4.0]),
    (0.125, [0.125]),
    (True, [1.0]),
])
def test_output_coercion(ret, expected):
    out = RewardCaller(lambda c1, c2: ret, 2)(PER_AGENT, PROMPTS, ITEMS)
    assert out == expected
    assert all(type(x) is float for x in out)


@pytest.mark.parametrize("make", ["float32", "int64", "0d"])
def test_output_coercion_numpy_scalars(make):
    np = pytest.importorskip("numpy")
    ret = {"float32": np.float32(0.5), "int64": np.int64(2), "0d": np.array(0.5)}[make]
    assert RewardCaller(lambda c1, c2: ret, 2)(PER_AGENT, PROMPTS, ITEMS) == [float(ret)]


def test_output_coercion_errors():
    with pytest.raises(TypeError, match="reward function returned"):
        to_floats(None)
    with pytest.raises(ValueError, match="empty"):
        to_floats([])


def test_call_cross_direct_call_and_batch_items_only():
    calls = []

    def f(c1, c2, batch_items=None, prompts=None):
        calls.append((c1, c2, batch_items, prompts))
        return [1.0]

    RewardCaller(f, 2).call_cross(PER_AGENT, ITEMS)
    assert calls == [(["a"], ["bb"], ITEMS, None)]  # prompts are not detected in cross mode


def test_call_cross_kwargs_function_gets_no_keywords():
    calls = []

    def f(c1, c2, **kw):
        calls.append(kw)
        return [1.0]

    RewardCaller(f, 2).call_cross(PER_AGENT, ITEMS)
    assert calls == [{}]


def test_call_cross_type_error_falls_back_to_list_of_strings():
    calls = []

    def f(texts):
        calls.append(texts)
        return [float(len(texts))]

    assert RewardCaller(f, 2).call_cross(PER_AGENT, ITEMS) == [2.0]
    assert calls == [["a", "bb"]]


# --- processors ------------------------------------------------------------------------------------


def test_processor_identity():
    for spec in (None, "identity"):
        p = resolve_processor(spec)
        assert p(-3.5) == -3.5 and p(0.0) == 0.0


def test_processor_scale():
    p = resolve_processor("scale:100")
    assert p(0.5) == 50.0 and p(-0.02) == pytest.approx(-2.0)
    assert resolve_processor("scale:-2.5")(2.0) == -5.0


def test_processor_clamp():
    p = resolve_processor("clamp:-1:1")
    assert [p(x) for x in (-5.0, -1.0, 0.3, 1.0, 7.0)] == [-1.0, -1.0, 0.3, 1.0, 1.0]
    d = resolve_processor("clamp")  # reference default clamp(min=-10, max=10)
    assert [d(x) for x in (-20.0, 5.0, 20.0)] == [-10.0, 5.0, 10.0]


def test_processor_sigmoid_scale():
    p = resolve_processor("sigmoid_scale")
    assert p(0.0) == 0.5
    assert p(2.0) == pytest.approx(0.8807970779778823, abs=1e-12)
    assert p(-2.0) == pytest.approx(1 - 0.8807970779778823, abs=1e-12)


def test_processor_exponential_scale():
    p = resolve_processor("exponential_scale:2")
    assert p(1.0) == pytest.approx(math.e ** 2 - 1)        # e^{fx} - 1 for x > 0
    assert p(-1.0) == pytest.approx(-(math.e ** 2) + 1)    # -e^{-fx} + 1 otherwise
    assert p(0.0) == 0.0
    assert p(0.5) == pytest.approx(math.e - 1)


def test_processor_normalize_by_length_is_identity_at_score_time():
    assert resolve_processor("normalize_by_length:1000")(0.7) == 0.7


def test_processor_import_path():
    assert resolve_processor("math:tanh")(0.5) == pytest.approx(math.tanh(0.5))


@pytest.mark.parametrize("spec", ["bogus", "scale", "scale:1:2", "clamp:1", "exponential_scale",
                                  "sigmoid_scale:3"])
def test_processor_unknown_spec_raises(spec):
    with pytest.raises(ValueError, match="unknown reward processor"):
        resolve_processor(spec)


def test_processor_bad_import_path_raises():
    with pytest.raises(ValueError, match="cannot import module"):
        resolve_processor("no_such_module_xyz:f")


# --- load_callable ---------------------------------------------------------------------------------


def test_load_callable_forms():
    assert load_callable("math:sqrt")(9.0) == 3.0
    assert load_callable("math.sqrt")(16.0) == 4.0
    assert load_callable("coopflow.rewards:length_ratio") is length_ratio


def test_load_callable_missing_module():
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module_xyz'"):
        load_callable("no_such_module_xyz:reward")


def test_load_callable_missing_attribute():
    with pytest.raises(ValueError, match=r"has no callable 'no_such_fn'"):
        load_callable("math:no_such_fn")


def test_load_callable_not_callable():
    with pytest.raises(ValueError, match=r"has no callable 'pi'"):
        load_callable("math:pi")


@pytest.mark.parametrize("path", ["justaname", ":f", "math:"])
def test_load_callable_malformed(path):
    with pytest.raises(ValueError, match="import path"):
        load_callable(path, "reward")


def test_resolve_reward_unknown_name():
    with pytest.raises(ValueError, match="reward 'nonexistent_reward'"):
        resolve_reward("nonexistent_reward")


# --- misbehaving rewards (issue 20) ------------------------------------------------------------------


def _score(fn, n=2, timeout=None):
    from coopflow.stages.score.rewards import RewardCaller
    from coopflow.stages.score.scores import score_rewards

    rows = [{"step": 0, "turn": 0, "node_id": 0, "item_id": 7, "agent": a, "sample": 0, "prompt": "p",
             "completion_text": f"text {a}"} for a in range(n)]
    return score_rewards(rows, {7: {"prompt": "p"}}, RewardCaller(fn, n, timeout), lambda x: x, "aligned", 0)


def hanging_reward(c1, c2):
    import time

    time.sleep(30)
    return [1.0]


def test_a_hanging_reward_fails_after_its_timeout_naming_it():
    import time

    from coopflow.stages.score.rewards import RewardError

    t0 = time.perf_counter()
    with pytest.raises(RewardError, match=r"hanging_reward did not return within 0.5 s.*\(item 7, joint action \[0, 0\]\)"):
        _score(hanging_reward, timeout=0.5)
    assert time.perf_counter() - t0 < 5


def slow_reward(c1, c2):
    import time

    time.sleep(1.2)
    return [0.25]


def test_a_slow_reward_says_it_is_still_running_and_finishes(monkeypatch, caplog):
    """A reward slower than the heartbeat but within its timeout: logged as still running, then scored."""
    import logging

    import coopflow.stages.score.rewards as R

    monkeypatch.setattr(R, "HEARTBEAT_S", 0.3)
    with caplog.at_level(logging.INFO, logger="coopflow.stages.score.rewards"):
        assert _score(slow_reward, timeout=5)[0]["reward"] == 0.25
    beats = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert 2 <= len(beats) <= 4, beats
    assert re.search(r"slow_reward still running after \d+ s \(limit 5 s", beats[0]), beats


def test_rewards_that_raise_or_return_junk_are_named():
    from coopflow.stages.score.rewards import RewardError

    def boom(c1, c2):
        raise KeyError("score")

    with pytest.raises(RewardError, match=r"KeyError from reward function .*boom on item 7, joint action \[0, 0\]"):
        _score(boom)
    with pytest.raises(RewardError, match=r"returned 4 values for one joint action .*expected 1 .* or 3"):
        _score(lambda c1, c2: [1.0, 2.0, 3.0, 4.0])
    assert _score(lambda c1, c2: [1.0, 2.0, 3.0])[0]["agent_rewards"] == [2.0, 3.0]  # team, then one per agent
    with pytest.raises(RewardError, match=r"returned 'good' \(str\); expected a float"):
        _score(lambda c1, c2: "good")
    with pytest.raises(RewardError, match=r"returned \['a'\] \(list\)"):
        _score(lambda c1, c2: ["a"])
    with pytest.raises(FloatingPointError, match="returned nan"):
        _score(lambda c1, c2: [float("nan")])
    assert _score(lambda c1, c2: [0.5], timeout=5)[0]["reward"] == 0.5


def test_reward_retries_are_opt_in_with_backoff(monkeypatch):
    import time as _time

    from coopflow.stages.score.rewards import RewardError

    calls, waits = [], []
    monkeypatch.setattr(_time, "sleep", waits.append)

    def flaky(c1, c2):
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("service busy")
        return [0.75]

    with pytest.raises(RewardError, match="ConnectionError from reward function .*flaky"):
        _score(flaky)  # retries off by default: the first failure stops the run
    calls.clear()
    from coopflow.stages.score.rewards import RewardCaller
    from coopflow.stages.score.scores import score_rewards

    rows = [{"step": 0, "turn": 0, "node_id": 0, "item_id": 7, "agent": a, "sample": 0, "prompt": "p",
             "completion_text": "t"} for a in range(2)]
    out = score_rewards(rows, {7: {"prompt": "p"}}, RewardCaller(flaky, 2, None, retries=2), lambda x: x, "aligned", 0)
    assert out[0]["reward"] == 0.75 and len(calls) == 3 and waits == [0.5, 1.0]
