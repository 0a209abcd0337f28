"""Stage: score rewards — form joint actions from the rollouts and score each with the shared reward.

Joint actions per node (one node = one item at one turn), K = samples per agent, N = agents:
- aligned: K joint actions (j, j, ..., j);
- cross:   K^N joint actions, the Cartesian product of the agents' samples;
- N = 1:   K single-agent actions (GRPO).

Each joint action gets `reward_raw` from the reward function (called per joint action with
one-element lists, through the reference's signature dispatch; `prompts` is agent 1's prompt at
that node, as in the reference) and `reward` =
processor(reward_raw). A reward function may also return N + 1 values for a joint action: the team
reward, then one local reward per agent (AT-GRPO's per-agent rewards); the processed locals are
stored in `agent_rewards` (empty for a one-value reward) and mixed in by the advantages. `env_step` counts scored joint actions across the run (the x-axis of every
metric); `env_step_base` is the count before this call.
"""

import itertools
import math
from collections import defaultdict
from collections.abc import Callable

from coopflow.stages.score.executors import Failed
from coopflow.stages.score.rewards import RewardCaller, RewardError


def joint_combos(k: int, n: int, joint_mode: str) -> list[tuple[int, ...]]:
    """Per-agent sample indices of every joint action of one node."""
    if n == 1 or joint_mode == "aligned":
        return [(j,) * n for j in range(k)]
    if joint_mode == "cross":
        return list(itertools.product(range(k), repeat=n))
    raise ValueError(f"unknown joint_mode {joint_mode!r}")


def score_rewards(rollouts: list[dict], items: dict[int, dict], caller: RewardCaller,
                  processor: Callable[[float], float], joint_mode: str, env_step_base: int,
                  node_items: dict[int, dict] | None = None) -> list[dict]:
    """Score rows (schema `scores`) for all nodes in `rollouts`, in node order."""
    texts: dict[tuple, dict[tuple[int, int], str]] = defaultdict(dict)
    meta: dict[tuple, tuple[int, str | None]] = {}
    for r in rollouts:
        node = (r["step"], r["turn"], r["node_id"])
        texts[node][(r["agent"], r["sample"])] = r["completion_text"]
        if r["agent"] == 0 or node not in meta:
            meta[node] = (r["item_id"], r.get("prompt"))
    n = caller.n
    jobs, calls = [], []
    cross = joint_mode == "cross" and n > 1
    for node in sorted(texts):
        step, turn, node_id = node
        item_id, prompt = meta[node]
        item = (node_items or {}).get(node_id) or items[item_id]
        prompt = item.get("prompt", "") if prompt is None else prompt
        k = 1 + max(s for (_, s) in texts[node])
        for j, combo in enumerate(joint_combos(k, n, joint_mode)):
            jobs.append((node, item_id, j, combo))
            calls.append(([[texts[node][(a, combo[a])]] for a in range(n)], [prompt], [item], cross))
    out: list[dict] = []
    env_step = env_step_base
    for ((step, turn, node_id), item_id, j, combo), vals in zip(jobs, caller.map(calls)):
        if isinstance(vals, Failed):
            err = vals.error
            if isinstance(err, RewardError):  # it names the reward already: add where
                raise RewardError(f"{err} (item {item_id}, joint action {list(combo)})") from err
            raise RewardError(f"{err.__class__.__name__} from reward function {getattr(caller, 'name', '?')} "
                              f"on item {item_id}, joint action {list(combo)}: {err}") from err
        if len(vals) not in (1, n + 1) or (len(vals) > 1 and n == 1):
            raise RewardError(f"reward function {getattr(caller, 'name', '?')} returned {len(vals)} values for one "
                              f"joint action (item {item_id}, joint action {list(combo)}); expected 1 (the team "
                              f"reward){f' or {n + 1} (the team reward, then one local reward per agent)' if n > 1 else ''}")
        raw = vals[0]
        bad = [v for v in vals if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"reward function returned {bad[0]} for item {item_id}, joint action {combo}")
        env_step += 1
        out.append({"step": step, "item_id": item_id, "turn": turn, "node_id": node_id, "joint_idx": j,
                    "combo": list(combo), "reward_raw": raw, "reward": float(processor(raw)),
                    "env_step": env_step, "agent_rewards": [float(processor(v)) for v in vals[1:]]})
    return out


def score_nodes(rollouts: list[dict], items: dict[int, dict], caller: RewardCaller,
                processor: Callable[[float], float], env_step_base: int, node_items: dict[int, dict] | None = None) -> list[dict]:
    """Actor-critic scoring: one reward call per node with each agent's K completions (and the agents'
    prompts), as the reference's IAC/MAAC do; the 1 / K / N values are expanded to per-agent rewards
    (`ac_targets.expand_rewards`). One score row per sample index j: agent_rewards[a] is agent a's
    reward, `reward` their mean (what early termination and reward_mean see)."""
    from coopflow.stages.score.ac_targets import expand_rewards

    texts: dict[tuple, dict[tuple[int, int], str]] = defaultdict(dict)
    prompts: dict[tuple, dict[int, str]] = defaultdict(dict)
    item_of: dict[tuple, int] = {}
    for r in rollouts:
        node = (r["step"], r["turn"], r["node_id"])
        texts[node][(r["agent"], r["sample"])] = r["completion_text"]
        prompts[node][r["agent"]] = r["prompt"]
        item_of[node] = r["item_id"]
    n, out, env_step = caller.n, [], env_step_base
    nodes, calls = sorted(texts), []
    for node in nodes:
        item = (node_items or {}).get(node[2]) or items[item_of[node]]
        k = 1 + max(s for (_, s) in texts[node])
        calls.append(([[texts[node][(a, j)] for j in range(k)] for a in range(n)],
                      [prompts[node][a] for a in range(n)], [item], False))
    for node, (per_agent, _, _, _), raw in zip(nodes, calls, caller.map(calls, "nodes")):
        if isinstance(raw, Failed):
            raise raw.error
        step, turn, node_id = node
        k = len(per_agent[0])
        bad = [v for v in raw if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"reward function returned {bad[0]} for item {item_of[node]}")
        raw_m = expand_rewards(list(raw), n, k)
        proc_m = expand_rewards([float(processor(v)) for v in raw], n, k)
        for j in range(k):
            env_step += 1
            rewards = [proc_m[a][j] for a in range(n)]
            out.append({"step": step, "item_id": item_of[node], "turn": turn, "node_id": node_id, "joint_idx": j,
                        "combo": [j] * n, "reward_raw": sum(raw_m[a][j] for a in range(n)) / n,
                        "reward": sum(rewards) / n, "env_step": env_step, "agent_rewards": rewards})
    return out
