"""Helpers shared by tests: reward functions used through the `module:function` import path, learning checks,
store helpers and the stage loops run directly (untracked) to fill a store."""

import time

from coopflow.artifacts import ArtifactStore
from coopflow.stages.score.rewards import length_ratio


def slow_length_ratio(c1, c2):
    """length_ratio, but slow enough that a test can kill the process mid-training."""
    time.sleep(0.05)
    return length_ratio(c1, c2)


REWARD_CALLS = {"n": 0}


def outage_length_ratio(c1, c2):
    """length_ratio behind a 'service' that goes down after $TEST_REWARD_DOWN_AFTER calls (until it is unset)."""
    import os

    REWARD_CALLS["n"] += 1
    down_after = os.environ.get("TEST_REWARD_DOWN_AFTER")
    if down_after and REWARD_CALLS["n"] > int(down_after):
        raise ConnectionError("scoring service unavailable")
    return length_ratio(c1, c2)


def loose_length_ratio(c1, c2):
    """A different reward (ratio 1–1.5 is best) for re-scoring tests."""
    return length_ratio(c1, c2, lo=1.0, hi=1.5)


def near_forty_chars(completions):
    """Single-agent reward (GRPO): 1 at 40 characters, falling off linearly."""
    return [max(0.0, 1.0 - abs(len(c) - 40) / 40) for c in completions]


TRANSITION_CALLS: list[dict] = []


def recording_transition(*, prompt, agent_completions, num_agents, prompt_history_per_agent,
                         response_history_per_agent):
    """A transition that records every call (keywords exactly as the reference passes them)."""
    TRANSITION_CALLS.append({"prompt": prompt, "agent_completions": list(agent_completions), "num_agents": num_agents,
                             "prompt_history_per_agent": prompt_history_per_agent,
                             "response_history_per_agent": response_history_per_agent})
    return [f"turn {len(prompt_history_per_agent[a]) + 1} for agent {a + 1}: {prompt}" for a in range(num_agents)]


def one_prompt_transition(*, prompt, agent_completions, num_agents, **_):
    """A broken transition: one prompt instead of one per agent."""
    return [prompt]


def turn_tagged_reward(prompts, c1, c2):
    """1.0 on turn-2 prompts (they contain 'Previous answers'), 0.25 on turn 1: makes turns tell apart."""
    return [1.0 if "Previous answers" in prompts[0] else 0.25]


HISTORY_SEEN: list[tuple] = []  # (turn, history, completions) per call of history_reward


def history_reward(c1, c2, *, batch_items):
    """Records the `_turn` and `_history` a multi-turn node's item carries; the reward is the turn index."""
    item = batch_items[0]
    HISTORY_SEEN.append((item.get("_turn"), item.get("_history"), (c1[0], c2[0])))
    return [float(item.get("_turn", -1))]


def char_length_metrics(samples):
    """A metrics_callback: mean completion length in characters (the reference's tldr example)."""
    return {"response_char_length_mean": sum(len(s["completion_text"]) for s in samples) / len(samples),
            "samples_seen": float(len(samples))}


def constant_reward(c1, c2):
    """The same reward for every joint answer: no preference pairs can be built."""
    return [0.5]


def killed_after_calls(c1, c2):
    """length_ratio, but the process SIGKILLs itself on call number KILL_AT_CALL (a crash mid-round)."""
    import os
    import signal

    _CALLS[0] += 1
    if _CALLS[0] == int(os.environ.get("KILL_AT_CALL", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return length_ratio(c1, c2)


_CALLS = [0]


LEARNING_SEEDS = (0, 1, 2)
"""Seeds every learning test runs: a gain must hold over several seeds, not on one lucky one."""


def multiturn_config(tmp_path, **trainer):
    """The tiny 2-turn feedback run config of the multi-turn tests (early termination off, 3 node samples per
    update); `trainer` overrides its trainer fields."""
    from coopflow.schemas.config import validate_config
    from tests.conftest import small_config

    cfg = small_config(tmp_path, transition={"name": "feedback"})
    cfg["trainer"] = {**cfg["trainer"], "num_turns": 2, "early_termination_threshold": None,
                      "rollout_buffer_size": 3, **trainer}
    return validate_config(cfg)


def assert_learns(gains: list[float], min_mean: float, min_improving: int | None = None) -> None:
    """A learning claim over seeds: the mean gain is above `min_mean` and at least `min_improving` seeds
    (default: all) improve at all. Float reductions differ between CPUs, so one seed's trajectory may
    differ from machine to machine; the mean over seeds is what the tests pin."""
    need = len(gains) if min_improving is None else min_improving
    assert sum(gains) / len(gains) > min_mean and sum(g > 0 for g in gains) >= need, gains


# --- loopback HTTP services (stand-ins for model APIs) -------------------------------------------------


def send_json(handler, code: int, obj) -> None:
    """Answer a BaseHTTPRequestHandler request with `obj` as JSON and HTTP `code`."""
    import json

    data = json.dumps(obj).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def loopback_server(handler_cls):
    """A generator for a pytest fixture: serves `handler_cls` on 127.0.0.1 in a thread, yields its base URL."""
    import threading
    from http.server import ThreadingHTTPServer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


class FixedSplitAdapter:
    """A centralized adapter for the tiny model: the role prompts joined with ' | '; role i of the joint completion
    is its characters [12 i, 12 (i + 1)), the last role the rest; an empty completion is a parse error. With
    length_ratio the joint actor must learn a total length of 36-48 characters."""

    def build_prompt(self, batch_item, agent_prompts):
        return " | ".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        from coopflow.stages.tasks.centralized import CentralizedComparatorParseError

        if not completion:
            raise CentralizedComparatorParseError("empty joint completion")
        return [completion[12 * i:12 * (i + 1)] for i in range(num_agents - 1)] + [completion[12 * (num_agents - 1):]]


ROLE_SPLITS_SEEN: list = []


def recording_eval_logger(agent_completions_turns, test_cases, entry_points, prompts):
    """An eval_logger that records what it is given; one row per path."""
    ROLE_SPLITS_SEEN.append(agent_completions_turns)
    return [{"n_agents": len(agent_completions_turns)} for _ in prompts]


def recording_eval_aggregator(detailed, num_turns):
    """Aggregates recording_eval_logger's rows: how many agents the logger saw."""
    return {"turn_1/agents_seen": float(detailed[0]["n_agents"])}


def last_two_length_ratio(*completions):
    """length_ratio of the last two agents' answers, for any N >= 2 (a varargs reward)."""
    return length_ratio(completions[-2], completions[-1])


def sleepy_length_ratio(c1, c2):
    """length_ratio after 0.1 s (an 'expensive' reward, for fan-out tests)."""
    time.sleep(0.1)
    return length_ratio(c1, c2)


def stuck_reward(c1, c2):
    """A reward that never returns in time."""
    time.sleep(60)
    return [0.0]


def picky_reward(c1, c2):
    """Raises on one particular joint action (agent 1 wrote 'bad')."""
    if c2[0] == "bad":
        raise KeyError("no score for 'bad'")
    return length_ratio(c1, c2)


def delayed_length_ratio(c1, c2, delay: float = 0.1):
    """length_ratio after `delay` seconds (keeps a run busy long enough for a concurrency test)."""
    time.sleep(delay)
    return length_ratio(c1, c2)


def remove_segment(store, key: str) -> list[tuple[str, str]]:
    """Delete a stored checkpoint and the steps and metrics stored beside it (keys `<key>-...`), as a crash before
    they were written would leave the store; returns what the records were (both kinds must be there)."""
    records = [(kind, k) for kind, k in store.artifacts() if kind in ("steps", "metrics") and k.startswith(key + "-")]
    assert {kind for kind, _ in records} == {"steps", "metrics"}, records
    assert store.remove("checkpoint", key) and all(store.remove(kind, k) for kind, k in records)
    return records


def run_stages(cfg, store=None, show_progress: bool = False, session=None) -> dict:
    """A run of any algorithm through the one driver with the inline runner, untracked (what the fault tests'
    kill-and-rerun children and the disk tests run to fill a store); `session` may carry live agents. `store`, when
    given, must be the config's own."""
    from coopflow.flows.driver import run_inline

    if store is not None:
        assert store.root == ArtifactStore.of(cfg).root, (store.root, cfg.data_dir)
    return {"algorithm": cfg.algorithm, **run_inline(cfg, show_progress, session=session)}


def paced_length_ratio(c1, c2):
    """length_ratio after 1 s (a run long enough to be interrupted from outside)."""
    time.sleep(1.0)
    return length_ratio(c1, c2)


def die_now(agent):
    """A per-agent op that SIGKILLs the worker process running it (a worker dying mid-op)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
