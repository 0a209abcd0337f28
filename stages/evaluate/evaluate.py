"""Stage: evaluate — a single sampled path per eval item.

At every turn each agent generates **one** completion per eval item (one batched generate per
agent per turn), the joint action is scored with the task reward, and — for multi-turn runs — the
transition turns that joint action into the next turn's prompts (no branching and no early
termination on the eval path). Metrics per turn t: `eval/turn_t/reward_mean` and
`eval/turn_t/expected_return` (the reward-to-go r_t + discount · r_{t+1} + ...; with the default
discount 1.0 the reference's undiscounted sum).

With `samples` = n > 1 (`trainer.eval_samples_per_item`) every item is evaluated along n independent
sampled paths (eval rows carry `sample` 0..n-1; the metrics are means over items × samples) and the
evaluation hooks receive each item n times in a row, so an aggregator can report pass@k for k ≤ n.
"""

import inspect
from collections.abc import Callable

from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts
from coopflow.stages.agents.state import PolicyGroup
from coopflow.stages.score.rewards import RewardCaller
from coopflow.stages.rollout.tree import Episode
from coopflow.stages.score.scores import score_nodes, score_rewards


def evaluate(policies: PolicyGroup, items: list[dict], formatters: list[Callable[[dict], str]],
             sampling: SamplingConfig, caller: RewardCaller, processor: Callable[[float], float],
             seed: int, episode: Episode | None = None, hooks: tuple | None = None,
             samples: int = 1) -> tuple[list[dict], dict[str, float]]:
    """Eval rows (schema `eval`) and metrics for the given items, `samples` paths per item; `hooks` =
    (eval_logger, eval_aggregator) adds the aggregator's `turn_k/...` metrics as `eval/turn_k/...` (the
    reference's evaluation hooks)."""
    if not items:
        return [], {}
    if samples < 1:
        raise ValueError(f"eval samples per item must be >= 1, got {samples}")
    episode = episode or Episode()
    n = policies.n
    one = sampling.with_k(1)
    by_id = {it["_item_id"]: it for it in items}
    # --- one path per (item, sample): path p is item p // samples, sample p % samples (its node id is p)
    paths = [it for it in items for _ in range(samples)]
    ids = [it["_item_id"] for it in paths]
    prompts = [[f(it) for it in paths] for f in formatters]
    ph = [[[] for _ in range(n)] for _ in paths]
    rh = [[[] for _ in range(n)] for _ in paths]
    rows: list[dict] = []
    for turn in range(episode.num_turns):
        rollouts = generate_rollouts(policies, prompts, ids, one, seed=seed, step=-1, turn=turn)
        node_items = {p: ni for p, it in enumerate(paths) if (ni := episode.node_item(it, turn, rh[p])) is not None}
        scores = (score_nodes(rollouts, by_id, caller, processor, 0, node_items) if episode.reward_per_node
                  else score_rewards(rollouts, by_id, caller, processor, "aligned", 0, node_items))
        reward = {s["node_id"]: s["reward"] for s in scores}
        rows += [{"item_id": r["item_id"], "sample": r["node_id"] % samples, "turn": turn, "agent": r["agent"],
                  "prompt": r["prompt"], "completion_text": r["completion_text"], "reward": reward[r["node_id"]],
                  "return": 0.0} for r in rollouts]
        if turn == episode.num_turns - 1:
            break
        text = {(r["node_id"], r["agent"]): r["completion_text"] for r in rollouts}
        nxt: list[list[str]] = [[] for _ in range(n)]
        for p, it in enumerate(paths):
            joint = [text[(p, a)] for a in range(n)]
            for a in range(n):
                ph[p][a].append(prompts[a][p])
                rh[p][a].append(joint[a])
            ext = episode.transition(it.get("prompt", ""), joint, ph[p], rh[p], reward=reward[p], item=it)
            for a in range(n):
                nxt[a].append(episode.prompt_for(formatters[a], it, ext[a]))
        prompts = nxt
    # --- reward-to-go per (item, sample, turn), written into the rows
    per = {(r["item_id"], r["sample"], r["turn"]): r["reward"] for r in rows}
    togo: dict[tuple, float] = {}
    for (item_id, s, turn) in sorted(per, key=lambda k: -k[2]):
        togo[(item_id, s, turn)] = per[(item_id, s, turn)] + episode.discount * togo.get((item_id, s, turn + 1), 0.0)
    for r in rows:
        r["return"] = togo[(r["item_id"], r["sample"], r["turn"])]
    metrics = eval_metrics(rows)
    if hooks:
        metrics.update(hook_metrics(rows, items, policies.n, episode.num_turns, *hooks))
    return rows, metrics


def hook_metrics(rows: list[dict], items: list[dict], n: int, num_turns: int, logger: Callable,
                 aggregator: Callable) -> dict[str, float]:
    """eval_logger(agent_completions_turns=[agent][item][turn], test_cases, entry_points, prompts) -> detailed;
    eval_aggregator(detailed, num_turns=H) -> {key: number}, logged as eval/<key> (non-numbers dropped).
    With several samples per item, each item appears once per sample, consecutively. A logger that declares
    an `items` keyword also receives the task items (e.g. a tool-use task's function docs and answers)."""
    text = {(r["agent"], r["item_id"], r.get("sample", 0), r["turn"]): r["completion_text"] for r in rows}
    samples = 1 + max((r.get("sample", 0) for r in rows), default=0)
    paths = [(it, s) for it in items for s in range(samples)]
    turns = sorted({r["turn"] for r in rows})
    completions = [[[text.get((a, it["_item_id"], s, t), "") for t in turns] for it, s in paths] for a in range(n)]
    extra = {}
    try:
        if "items" in inspect.signature(logger).parameters:  # opt-in: the task items themselves
            extra["items"] = [{k: v for k, v in it.items() if not k.startswith("_")} for it, _ in paths]
    except (TypeError, ValueError):
        pass
    detailed = logger(agent_completions_turns=completions, test_cases=[it.get("test") for it, _ in paths],
                      entry_points=[it.get("entry_point") for it, _ in paths],
                      prompts=[it.get("prompt") for it, _ in paths], **extra)
    out = {}
    for k, v in (aggregator(detailed, num_turns=num_turns) or {}).items():
        try:
            out[f"eval/{k}"] = float(v)
        except (TypeError, ValueError):
            continue
    return out


def eval_metrics(rows: list[dict]) -> dict[str, float]:
    """eval/turn_t/reward_mean and eval/turn_t/expected_return from eval rows (means over items × samples)."""
    per = {(r["item_id"], r.get("sample", 0), r["turn"]): (r["reward"], r["return"]) for r in rows}
    out: dict[str, float] = {}
    for turn in sorted({t for *_, t in per}):
        vals = [v for (*_, t), v in per.items() if t == turn]
        out[f"eval/turn_{turn + 1}/reward_mean"] = sum(v[0] for v in vals) / len(vals)
        out[f"eval/turn_{turn + 1}/expected_return"] = sum(v[1] for v in vals) / len(vals)
    return out
