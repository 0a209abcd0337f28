"""Stage: tree rollouts — multi-turn episodes as trees of joint actions, generated one depth at a time.

An episode (one training item) is a tree. A node is one turn of one branch: every
agent samples K completions for its prompt at that node, and the node's joint actions (aligned: K,
cross: K^N) are scored with the shared reward. Unless the branch stops early (the node's mean
reward is **above** `early_termination_threshold`) or the last turn is reached, each joint action j
gets a child node whose prompts come from the transition, called with this branch's prompt and
response histories (current turn included). Single-turn training is the depth-1 tree.

Batching: all nodes of one depth — over every item of the update — go into **one** `generate` per
agent; then they are scored, expanded, and the next depth runs. Node ids are unique within the
update and assigned breadth-first; env_steps count scored joint actions in the same order.

Returns (computed later from the stored tables, see `compute_advantages.joint_returns`):
leaf R_j = r_j; internal R_j = r_j + discount · mean(returns of child j).

Greedy expansion (`expansion='best'`, AT-GRPO's tree-structured sampling, Zhao et al. 2025, arXiv 2510.11062):
only the node's highest-reward joint action (the first of equals) gets a child, so an episode is one path of
`num_turns` nodes, each with K candidates per agent that share one prompt — AT-GRPO's agent- and turn-wise
groups — and the episode continues from the best candidate. Every candidate is judged by its own turn's reward
(the others have no continuation to compare), so returns are the turn's rewards.
"""

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts
from coopflow.stages.agents.state import PolicyGroup
from coopflow.stages.score.rewards import RewardCaller
from coopflow.stages.score.scores import score_nodes, score_rewards
from coopflow.stages.tasks.transitions import Transition


@dataclass(frozen=True)
class Episode:
    """How an episode unfolds after turn 1 (the trainer's multi-turn settings)."""

    num_turns: int = 1
    joint_mode: str = "aligned"
    transition: Transition | None = None
    early_termination_threshold: float | None = None
    passthrough: bool = False
    discount: float = 1.0
    reward_per_node: bool = False  # actor-critic: one reward call per node with K-lists (score_nodes)
    expansion: str = "all"  # all: every joint action continues | best: only the node's best (AT-GRPO's greedy tree)

    def score(self, rows: list[dict], items: dict[int, dict], caller: RewardCaller, processor, env: int,
              node_items: dict[int, dict] | None = None) -> list[dict]:
        """Score the nodes of `rows` (MAGRPO: per joint action; actor-critic: per node, expanded); `node_items`
        (node id -> item) overrides the item of a node, e.g. with its turn and branch history."""
        if self.reward_per_node:
            return score_nodes(rows, items, caller, processor, env, node_items)
        return score_rewards(rows, items, caller, processor, self.joint_mode, env, node_items)

    def node_item(self, item: dict, turn: int, response_history: list[list[str]]) -> dict | None:
        """A multi-turn node's item as the reward sees it: the task item plus `_turn` (0-based) and `_history`
        (per agent, the answers of the earlier turns along the branch); None for single-turn episodes."""
        if self.num_turns == 1:
            return None
        return {**item, "_turn": turn, "_history": [list(h) for h in response_history]}

    def prompt_for(self, formatter: Callable[[dict], str], item: dict, external: str) -> str:
        """An agent's prompt at a later turn: the transition's prompt, through the formatter unless passthrough."""
        if self.passthrough:
            return external
        return formatter({**item, "prompt": external, "_original_prompt": item.get("prompt", "")})

    def stops(self, node_rewards: list[float]) -> bool:
        """Early termination: the node's mean (processed) reward exceeds the threshold."""
        t = self.early_termination_threshold
        return t is not None and bool(node_rewards) and statistics.fmean(node_rewards) > t


@dataclass
class _Node:
    node_id: int
    item: dict
    prompts: list[str]
    parent: tuple[int, int] = (-1, -1)
    prompt_history: list[list[str]] = field(default_factory=list)
    response_history: list[list[str]] = field(default_factory=list)


def generate_tree(policies: PolicyGroup, items: list[dict], formatters: list[Callable[[dict], str]],
                  sampling: SamplingConfig, episode: Episode, caller: RewardCaller,
                  processor: Callable[[float], float], seed: int, step: int,
                  env_step_base: int) -> tuple[list[dict], list[dict]]:
    """(rollout rows, score rows) of the trees of `items`, generated depth by depth."""
    n = policies.n
    frontier = [_Node(j, it, [f(it) for f in formatters], prompt_history=[[] for _ in range(n)],
                      response_history=[[] for _ in range(n)]) for j, it in enumerate(items)]
    by_id = {it["_item_id"]: it for it in items}
    next_id = len(frontier)
    rows_out: list[dict] = []
    scores_out: list[dict] = []
    env = env_step_base
    for turn in range(episode.num_turns):
        if not frontier:
            break
        # --- one generate per agent over every node of this depth
        rows = generate_rollouts(policies, [[nd.prompts[a] for nd in frontier] for a in range(n)],
                                 [nd.item["_item_id"] for nd in frontier], sampling, seed, step, turn,
                                 [nd.node_id for nd in frontier], [nd.parent for nd in frontier])
        node_items = {nd.node_id: episode.node_item(nd.item, turn, nd.response_history) for nd in frontier}
        scores = episode.score(rows, by_id, caller, processor, env,
                               {k: v for k, v in node_items.items() if v is not None})
        env = scores[-1]["env_step"] if scores else env
        rows_out += rows
        scores_out += scores
        if turn == episode.num_turns - 1:
            break
        # --- expand: one child per joint action of every node that does not stop
        texts = {(r["node_id"], r["agent"], r["sample"]): r["completion_text"] for r in rows}
        node_scores: dict[int, list[dict]] = defaultdict(list)
        for s in scores:
            node_scores[s["node_id"]].append(s)
        children = []
        for nd in frontier:
            mine = sorted(node_scores[nd.node_id], key=lambda s: s["joint_idx"])
            if episode.stops([s["reward"] for s in mine]):
                continue
            ph = [nd.prompt_history[a] + [nd.prompts[a]] for a in range(n)]
            if episode.expansion == "best":  # max keeps the first of equal rewards
                mine = [max(mine, key=lambda s: s["reward"])]
            for s in mine:
                joint = [texts[(nd.node_id, a, s["combo"][a])] for a in range(n)]
                rh = [nd.response_history[a] + [joint[a]] for a in range(n)]
                ext = episode.transition(nd.item.get("prompt", ""), joint, ph, rh, reward=s["reward"], item=nd.item)
                prompts = [episode.prompt_for(formatters[a], nd.item, ext[a]) for a in range(n)]
                children.append(_Node(next_id, nd.item, prompts, (nd.node_id, s["joint_idx"]), ph, rh))
                next_id += 1
        frontier = children
    return rows_out, scores_out
