"""Signs of life: generation and scoring heartbeats (also from agent worker processes), and log lines that do not
break progress bars."""

import io
import logging
import re
import sys

import pytest

from coopflow.stages.agents.spec import AgentSpec, specs_for
from coopflow.stages.common import progress

PROMPTS = ["write a story about a robot", "the moon"]


@pytest.fixture
def beat_always(monkeypatch, caplog):
    """Heartbeats at every tick, captured at INFO."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.0)
    caplog.set_level(logging.INFO, logger="stages")
    return caplog


def _lines(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_generation_heartbeat_reports_tokens_and_rate(tiny_model_dir, beat_always, backend):
    from coopflow.stages.agents.models import load_agent_state
    from coopflow.stages.rollout.generate import SamplingConfig, generate_for_agent

    agent = load_agent_state(AgentSpec(str(tiny_model_dir), 1e-3))
    sampling = SamplingConfig(2, 6, 1.0, 1.0, None, backend)
    rows = generate_for_agent(agent.model, agent.tokenizer, PROMPTS, 2, sampling, seed=3, label="agent 1")
    lines = _lines(beat_always, "coopflow.stages.rollout.generate")
    steps = max(len(r[1]) for r in rows)
    assert len(lines) >= steps  # a beat per decoded token at interval 0, then the last line
    assert re.fullmatch(r"generate agent 1: 1/6 tokens × 4 sequences, [\d.]+ tokens/s, [\d.]+ s", lines[0]), lines[0]
    assert re.fullmatch(rf"generate agent 1: done, {steps}/6 tokens × 4 sequences, [\d.]+ tokens/s, [\d.]+ s",
                        lines[-1]), lines[-1]


def test_generation_is_quiet_when_shorter_than_the_interval(tiny_model_dir, caplog):
    from coopflow.stages.agents.models import load_agent_state
    from coopflow.stages.rollout.generate import SamplingConfig, generate_for_agent

    caplog.set_level(logging.INFO, logger="stages")
    agent = load_agent_state(AgentSpec(str(tiny_model_dir), 1e-3))
    generate_for_agent(agent.model, agent.tokenizer, PROMPTS, 1, SamplingConfig(1, 4, 1.0, 1.0, None), seed=0)
    assert not _lines(caplog, "coopflow.stages.rollout.generate")


def test_agent_worker_heartbeats_reach_the_main_process(tiny_model_dir, beat_always):
    from coopflow.stages.agents.workers import WorkerPolicies
    from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts

    pol = WorkerPolicies(specs_for([tiny_model_dir, tiny_model_dir], 1e-3))
    try:
        rows = generate_rollouts(pol, [PROMPTS, PROMPTS], [0, 1], SamplingConfig(2, 5, 1.0, 1.0, None), seed=0,
                                 step=0, turn=1)
    finally:
        pol.close()
    assert len(rows) == 2 * 2 * 2
    lines = _lines(beat_always, "coopflow.stages.rollout.generate")
    for a in (0, 1):  # each worker's lines, relayed under the worker's logger name
        mine = [x for x in lines if x.startswith(f"generate agent {a} turn 2: ")]
        assert mine and all("tokens/s" in x for x in mine) and "done" in mine[-1], lines


def test_scoring_heartbeat_counts_joint_actions(beat_always):
    from coopflow.stages.score.rewards import RewardCaller, length_ratio
    from coopflow.stages.score.scores import score_rewards

    rollouts = [{"step": 0, "turn": 0, "node_id": node, "item_id": node, "agent": a, "sample": s, "prompt": "p",
                 "completion_text": "x" * (1 + a + s)} for node in range(2) for a in range(2) for s in range(3)]
    items = {0: {"prompt": "p"}, 1: {"prompt": "p"}}
    out = score_rewards(rollouts, items, RewardCaller(length_ratio, 2), lambda x: x, "cross", 0)
    assert len(out) == 2 * 9
    lines = _lines(beat_always, "coopflow.stages.score.rewards")
    assert re.fullmatch(r"score coopflow\.stages\.score\.rewards:length_ratio: 1/18 joint actions, [\d.]+ joint actions/s, "
                        r"[\d.]+ s", lines[0]), lines[0]
    assert lines[-1].startswith("score coopflow.stages.score.rewards:length_ratio: done, 18/18 joint actions")


def test_executor_map_reports_progress():
    from coopflow.stages.score.executors import ProcessExecutor, invoke

    seen: list[int] = []
    ex = ProcessExecutor(2)
    try:
        out = ex.map([(abs, (-i,), {}, None) for i in range(5)], 30, seen.append)
    finally:
        ex.close()
    assert out == [0, 1, 2, 3, 4] and seen == [1, 2, 3, 4, 5] and invoke(abs, (-1,), {}, None) == 1


def test_log_lines_do_not_break_an_active_bar(monkeypatch):
    from tqdm import tqdm

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    log = logging.getLogger("test-progress-bar")
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    log.handlers = [handler]
    try:
        with progress.bar_safe_logging():
            bar = tqdm(range(4), desc="segment 1/1", file=sys.stderr, mininterval=0, ascii=True)
            for i in bar:
                log.info("line %d", i)
            bar.close()
        assert log.handlers == [handler]  # restored
        log.info("after")
    finally:
        log.handlers = []
    text = stream.getvalue()
    logged = [seg for line in text.split("\n") for seg in [line.split("\r")[-1]] if "LOG line" in line]
    assert len(logged) == 4 and all(re.fullmatch(r"LOG line \d", seg) for seg in logged), text
    assert "segment 1/1" in text and text.endswith("LOG after\n")


def test_bar_safe_logging_leaves_other_handlers(monkeypatch):
    stream = io.StringIO()
    log = logging.getLogger("test-progress-file")
    file_like = logging.StreamHandler(stream)  # not a console stream: left alone
    log.handlers = [file_like]
    try:
        with progress.bar_safe_logging():
            assert log.handlers == [file_like]
        with progress.bar_safe_logging(enabled=False):
            assert log.handlers == [file_like]
    finally:
        log.handlers = []
