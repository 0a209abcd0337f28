"""Stage: compute returns and advantages per agent completion.

Per node, agent i's return for its own completion k:
- aligned / single agent: the joint return of joint action k (shared by all agents);
- cross: the **sum** of the joint returns of all K^(N-1) joint actions containing completion k.

Joint returns over a multi-turn tree (post-order): a leaf joint action's return is its reward; an
internal one's is r_j + discount · mean(returns of its child node's joint actions). Single turn:
return = reward.

Advantage over the K returns R of one group (node × agent):
- mean:  A = R − mean(R)                         (MAGRPO)
- raw:   A = R                                   (MAREINFORCE)
- max:   A = R − max(R)                          (MAReMax)
- rloo:  A_k = R_k − mean_{l≠k} R_l              (MARLOO; G ≤ 1 falls back to mean)
then, if normalization is on, A ← (A − mean A) / max(std_pop(A), 1e-6) over a scope
(`advantage_normalization_scope`; a scope of one value is left as it is):
- group: the G advantages of one node × agent (MAGRPO, CoMLRL's normalization; the default);
- agent: all of one agent's advantages in the update (every node and turn of its rollout buffer) — Dr. MAS's
  agent-wise normalization (Feng et al. 2026, arXiv 2602.08847): each agent's gradient scale follows its own
  return statistics instead of one shared set;
- batch: every agent's advantages in the update together — REINFORCE++-baseline's global normalization
  (Hu 2025, arXiv 2501.03262: a group-mean baseline, then normalization over the whole batch).
With one shared reward in aligned mode every agent sees the same returns, so agent and batch give the same
numbers; they differ where agents' returns differ (per-agent local rewards, cross mode, the reference KL).
"""

from collections import defaultdict

import torch

from coopflow.stages.agents.reference_kl import apply_reference_kl

ADVANTAGE_MODES = ("mean", "raw", "max", "rloo")
NORMALIZATION_SCOPES = ("group", "agent", "batch")


def z_normalize(A: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A − mean A) / max(std_pop(A), eps); a single value is returned unchanged."""
    if A.numel() <= 1:
        return A
    return (A - A.mean()) / torch.clamp(A.std(unbiased=False), min=eps)


def advantages(returns: torch.Tensor, mode: str, normalize: bool, eps: float = 1e-6) -> torch.Tensor:
    """Advantages of one group of G returns (1-D tensor)."""
    R = returns.double()
    G = R.numel()
    if mode == "raw":
        A = R.clone()
    elif mode == "max":
        A = R - R.max()
    elif mode == "rloo" and G > 1:
        A = (G * R - R.sum()) / (G - 1)
    elif mode in ("mean", "rloo"):
        A = R - R.mean()
    else:
        raise ValueError(f"advantage_mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    return z_normalize(A, eps) if normalize else A


def tree_children(rollouts: list[dict]) -> dict[tuple, dict[int, tuple]]:
    """{parent node key: {joint_idx: child node key}} from rollout rows' parent links (empty for one turn)."""
    out: dict[tuple, dict[int, tuple]] = defaultdict(dict)
    for r in rollouts:
        if r.get("parent_node", -1) >= 0:
            out[(r["step"], r["turn"] - 1, r["parent_node"])][r["parent_joint"]] = (r["step"], r["turn"], r["node_id"])
    return dict(out)


def agent_reward(score: dict, agent: int, team_weight: float) -> float:
    """Agent `agent`'s reward of a joint action: team_weight · team reward + its local reward (AT-GRPO's mix; 0
    when the reward function returned only the team value)."""
    local = score["agent_rewards"][agent] if score.get("agent_rewards") else 0.0
    return team_weight * score["reward"] + local


def joint_returns(scores: list[dict], children: dict[tuple, dict[int, tuple]] | None = None,
                  discount: float = 1.0, reward=None) -> dict[tuple, float]:
    """{(step, turn, node_id, joint_idx): return}: reward plus discount × mean return of the child node
    (`reward(score row)`: the reward a joint action counts with, default its team `reward`)."""
    by_node: dict[tuple, list[dict]] = defaultdict(list)
    for s in scores:
        by_node[(s["step"], s["turn"], s["node_id"])].append(s)
    children = children or {}
    out: dict[tuple, float] = {}
    for node in sorted(by_node, key=lambda k: -k[1]):  # deepest turn first: children are done before parents
        kids = children.get(node, {})
        for s in by_node[node]:
            R = s["reward"] if reward is None else reward(s)
            child = kids.get(s["joint_idx"])
            if child is not None:
                cr = [out[child + (j["joint_idx"],)] for j in by_node[child]]
                R += discount * sum(cr) / len(cr)
            out[node + (s["joint_idx"],)] = R
    return out


def per_agent_returns(scores: list[dict], num_agents: int, k: int, joint_mode: str,
                      returns: dict[tuple, float] | list[dict[tuple, float]] | None = None) -> dict:
    """`{(step, turn, node_id): returns[agent][sample]}` from the node's joint returns (default: rewards; a list
    holds one returns dict per agent, when agents count joint actions with rewards of their own)."""
    by_node: dict[tuple, list[dict]] = defaultdict(list)
    for s in scores:
        by_node[(s["step"], s["turn"], s["node_id"])].append(s)
    out = {}
    for node, rows in by_node.items():
        rets = [[0.0] * k for _ in range(num_agents)]
        for r in rows:
            for a in range(num_agents):
                ret = returns[a] if isinstance(returns, list) else returns
                R = ret[node + (r["joint_idx"],)] if ret is not None else r["reward"]
                if joint_mode == "cross" and num_agents > 1:
                    rets[a][r["combo"][a]] += R
                else:
                    rets[a][r["combo"][a]] = R
        out[node] = rets
    return out


def compute_advantages(scores: list[dict], item_of_node: dict[tuple, int], num_agents: int, k: int,
                       joint_mode: str, mode: str, normalize: bool, kls: dict[tuple, float] | None = None,
                       kl_coef: float = 0.0, children: dict[tuple, dict[int, tuple]] | None = None,
                       discount: float = 1.0, scope: str = "group", team_weight: float = 1.0) -> list[dict]:
    """Advantage rows (schema `advantages`) for every node × agent × sample.

    With `kls` ({(step, turn, node_id, agent, sample): KL}), each return first becomes R − kl_coef·KL
    (the reference-KL adjustment, applied per agent to its own completions before the baseline); the
    stored `return` is the adjusted one. `children` (from `tree_children`) links multi-turn nodes.
    `scope` (with `normalize`): group | agent | batch, see the module docstring. Per-agent local rewards (scores'
    `agent_rewards`) or a `team_weight` other than 1 give each agent its own returns: team_weight · team + local.
    """
    if scope not in NORMALIZATION_SCOPES:
        raise ValueError(f"advantage_normalization_scope must be one of {NORMALIZATION_SCOPES}, got {scope!r}")
    if team_weight == 1.0 and not any(s.get("agent_rewards") for s in scores):
        jr = joint_returns(scores, children, discount)
    else:
        jr = [joint_returns(scores, children, discount, lambda s, a=a: agent_reward(s, a, team_weight))
              for a in range(num_agents)]
    groups = []  # (node, agent, returns [K], advantages [K])
    for node, rets in sorted(per_agent_returns(scores, num_agents, k, joint_mode, jr).items()):
        for a in range(num_agents):
            own = rets[a]
            if kls is not None:
                own = apply_reference_kl(own, [kls[node + (a, s)] for s in range(k)], kl_coef)
            R = torch.tensor(own, dtype=torch.float64)
            groups.append((node, a, R, advantages(R, mode, normalize and scope == "group")))
    if normalize and scope != "group":  # one set of statistics per agent (agent) or for everything (batch)
        pools: dict[int, list[int]] = defaultdict(list)  # pool -> indices into groups
        for i, (_, a, _, _) in enumerate(groups):
            pools[a if scope == "agent" else 0].append(i)
        for idx in pools.values():
            flat = z_normalize(torch.cat([groups[i][3] for i in idx]))
            for j, i in enumerate(idx):
                groups[i] = groups[i][:3] + (flat[j * k:(j + 1) * k],)
    rows = []
    for node, a, R, A in groups:
        step, turn, node_id = node
        for s in range(k):
            rows.append({"step": step, "item_id": item_of_node[node], "turn": turn, "node_id": node_id,
                         "agent": a, "sample": s, "return": float(R[s]), "advantage": float(A[s])})
    return rows


def advantage_stats(rows: list[dict], num_agents: int) -> dict[str, float]:
    """`agent_i/advantage_mean` and `agent_i/advantage_std` (population) of one update's advantage rows: how
    large each agent's policy-gradient weights are (what the normalization scope changes)."""
    out = {}
    for a in range(num_agents):
        A = torch.tensor([r["advantage"] for r in rows if r["agent"] == a], dtype=torch.float64)
        if A.numel():
            out[f"agent_{a}/advantage_mean"] = float(A.mean())
            out[f"agent_{a}/advantage_std"] = float(A.std(unbiased=False))
    return out


def local_reward_means(scores: list[dict], num_agents: int) -> dict[str, float]:
    """`agent_i/local_reward_mean` over an update's joint actions, when the reward returns per-agent local rewards
    (empty otherwise)."""
    rows = [s["agent_rewards"] for s in scores if s.get("agent_rewards")]
    if not rows:
        return {}
    return {f"agent_{a}/local_reward_mean": sum(r[a] for r in rows) / len(rows) for a in range(num_agents)}
