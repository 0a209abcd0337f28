"""Stage: compute returns and advantages per agent completion (spec §2.1.4–2.1.5).

Per node, agent i's return for its own completion k:
- aligned / single agent: the joint return of joint action k (shared by all agents);
- cross: the **sum** of the joint returns of all K^(N-1) joint actions containing completion k.

(Single turn: return = reward. Multi-turn returns add the mean of the children's returns.)

Advantage over the K returns R of one group (node × agent):
- mean:  A = R − mean(R)                         (MAGRPO)
- raw:   A = R                                   (MAREINFORCE)
- max:   A = R − max(R)                          (MAReMax)
- rloo:  A_k = R_k − mean_{l≠k} R_l              (MARLOO; G ≤ 1 falls back to mean)
then, if normalization is on and G > 1: A ← (A − mean A) / max(std_pop(A), 1e-6).
"""

from collections import defaultdict

import torch

from stages.reference_kl import apply_reference_kl

ADVANTAGE_MODES = ("mean", "raw", "max", "rloo")


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
    if normalize and G > 1:
        A = (A - A.mean()) / torch.clamp(A.std(unbiased=False), min=eps)
    return A


def per_agent_returns(scores: list[dict], num_agents: int, k: int, joint_mode: str) -> dict:
    """{(step, turn, node_id): [agent][sample] -> return} from the node's joint rewards."""
    by_node: dict[tuple, list[dict]] = defaultdict(list)
    for s in scores:
        by_node[(s["step"], s["turn"], s["node_id"])].append(s)
    out = {}
    for node, rows in by_node.items():
        rets = [[0.0] * k for _ in range(num_agents)]
        if joint_mode == "cross" and num_agents > 1:
            for r in rows:
                for a, sample in enumerate(r["combo"]):
                    rets[a][sample] += r["reward"]
        else:
            for r in rows:
                for a in range(num_agents):
                    rets[a][r["combo"][a]] = r["reward"]
        out[node] = rets
    return out


def compute_advantages(scores: list[dict], item_of_node: dict[tuple, int], num_agents: int, k: int,
                       joint_mode: str, mode: str, normalize: bool, kls: dict[tuple, float] | None = None,
                       kl_coef: float = 0.0) -> list[dict]:
    """Advantage rows (schema `advantages`) for every node × agent × sample.

    With `kls` ({(step, turn, node_id, agent, sample): KL}), each return first becomes R − kl_coef·KL
    (the reference-KL adjustment, applied per agent to its own completions before the baseline); the
    stored `return` is the adjusted one.
    """
    rows = []
    for node, rets in sorted(per_agent_returns(scores, num_agents, k, joint_mode).items()):
        step, turn, node_id = node
        for a in range(num_agents):
            own = rets[a]
            if kls is not None:
                own = apply_reference_kl(own, [kls[node + (a, s)] for s in range(k)], kl_coef)
            R = torch.tensor(own, dtype=torch.float64)
            A = advantages(R, mode, normalize)
            for s in range(k):
                rows.append({"step": step, "item_id": item_of_node[node], "turn": turn, "node_id": node_id,
                             "agent": a, "sample": s, "return": float(R[s]), "advantage": float(A[s])})
    return rows
