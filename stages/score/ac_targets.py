"""Stage: actor-critic targets and advantages.

Inputs per agent sample: the (expanded, processed) reward r, the reference KL (when on), and the
critic's old value V_old. With reference KL on, the reward is shaped: r' = r − coef · KL.

- single turn:  target = r'                                   (K samples are independent rollouts)
- multi-turn (one sample per turn, an agent's samples of one item form a trajectory t = 0..T):
                target_t = r'_t + γ · V_old(h_{t+1})   for t < T,   target_T = r'_T
                (T is the last executed turn: early termination makes it terminal)
- the logged return is the discounted Monte-Carlo return G_t = r'_t + γ · G_{t+1}
- advantage A = target − V_old, then (advantage_normalization, group size > 1) z-normalized over
  the update group — one agent's samples of one turn in one update — with population std, eps 1e-6.

The value target of the critic is the same `target`.
"""

from collections import defaultdict

import torch


def expand_rewards(values: list[float], num_agents: int, k: int) -> list[list[float]]:
    """The reward function's list for one node -> an N × K matrix (reference rules, in this order):
    1 value -> everyone; K values -> one per sample index (shared by agents); N values -> one per agent."""
    if len(values) == 1:
        return [[values[0]] * k for _ in range(num_agents)]
    if len(values) == k:
        return [list(values) for _ in range(num_agents)]
    if len(values) == num_agents:
        return [[values[a]] * k for a in range(num_agents)]
    raise ValueError(f"reward function returned {len(values)} values for one prompt; it must return 1, "
                     f"num_generations ({k}) or num_agents ({num_agents}) values")


def compute_targets(samples: list[dict], discount: float, kl_coef: float | None, normalize: bool) -> list[dict]:
    """Fill shaped_reward, value_target, mc_return, advantage, norm_advantage into each sample dict.

    Each sample needs: step, item_id, turn, node_id, agent, sample, reward, ref_kl, old_value.
    Samples of one (item, agent, sample index) across turns form a trajectory (multi-turn: K = 1).
    """
    trajs: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        s["shaped_reward"] = s["reward"] - (kl_coef * s["ref_kl"] if kl_coef is not None else 0.0)
        trajs[(s["step"], s["item_id"], s["agent"], s["sample"])].append(s)
    for traj in trajs.values():
        traj.sort(key=lambda s: s["turn"])
        future = 0.0
        for t in range(len(traj) - 1, -1, -1):
            s = traj[t]
            nxt = traj[t + 1]["old_value"] if t + 1 < len(traj) else None
            s["value_target"] = s["shaped_reward"] + (discount * nxt if nxt is not None else 0.0)
            future = s["shaped_reward"] + discount * future
            s["mc_return"] = future
            s["advantage"] = s["value_target"] - s["old_value"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        groups[(s["agent"], s["turn"])].append(s)
    for group in groups.values():
        A = torch.tensor([s["advantage"] for s in group], dtype=torch.float64)
        if normalize and A.numel() > 1:
            A = (A - A.mean()) / torch.clamp(A.std(unbiased=False), min=1e-6)
        for s, a in zip(group, A.tolist()):
            s["norm_advantage"] = a
    return samples
