"""Stage: build preference pairs from scored joint candidates.

Per item, the P aligned joint candidates (c_{1,j}, …, c_{N,j}) carry one task reward each. Every
ordered pair (w, l) with r_w − r_l > 0 is a candidate pair (ties are dropped). Selection:

- `reward_gap`: largest gap first (stable for equal gaps: candidate order);
- `random`:     a seeded shuffle (seed, item);
- `all`:        every pair, sorted by (w, l) (`preference_pairs_per_sample` must be null);

then the first `preference_pairs_per_sample` are kept. Output rows (schema `pairs`): one per
(pair, agent), with that agent's prompt and its chosen (winner) / rejected (loser) completion — the
columns TRL's DPO trainer reads — plus the token ids the DPO update uses.
"""

import random
from collections import defaultdict

from coopflow.stages.common.seeds import derive_seed


def select_pairs(rewards: list[float], mode: str, limit: int | None, rng: random.Random | None = None
                 ) -> list[tuple[int, int]]:
    """(winner, loser) candidate indices for one item's rewards."""
    pairs = [(rewards[i] - rewards[j], i, j) for i in range(len(rewards)) for j in range(len(rewards))
             if i != j and rewards[i] - rewards[j] > 0]
    if mode == "random":
        (rng or random.Random(0)).shuffle(pairs)
    elif mode == "all":
        pairs.sort(key=lambda p: (p[1], p[2]))
    elif mode == "reward_gap":
        pairs.sort(key=lambda p: p[0], reverse=True)
    else:
        raise ValueError(f"pair_selection must be reward_gap, random or all; got {mode!r}")
    if mode != "all" and limit is not None:
        pairs = pairs[:limit]
    return [(w, l) for _, w, l in pairs]


def build_pairs(rollouts: list[dict], scores: list[dict], mode: str, limit: int | None, seed: int) -> list[dict]:
    """Pair rows for every item of a candidates artifact (rollouts + their aligned scores)."""
    reward: dict[int, dict[int, float]] = defaultdict(dict)
    for s in scores:
        reward[s["item_id"]][s["joint_idx"]] = s["reward"]
    comp: dict[tuple, dict] = {}
    for r in rollouts:
        comp[(r["item_id"], r["agent"], r["sample"])] = r
    agents = sorted({r["agent"] for r in rollouts})
    out, pair_id = [], 0
    for item_id in sorted(reward):
        rw = [reward[item_id][j] for j in range(len(reward[item_id]))]
        mean = sum(rw) / len(rw)
        for w, l in select_pairs(rw, mode, limit, random.Random(derive_seed(seed, "pairs", item_id))):
            for a in agents:
                cw, cl = comp[(item_id, a, w)], comp[(item_id, a, l)]
                out.append({"pair_id": pair_id, "item_id": item_id, "agent": a, "winner": w, "loser": l,
                            "winner_reward": rw[w], "loser_reward": rw[l], "candidate_reward_mean": mean,
                            "prompt": cw["prompt"], "chosen": cw["completion_text"], "rejected": cl["completion_text"],
                            "prompt_ids": cw["prompt_ids"], "chosen_ids": cw["completion_ids"],
                            "rejected_ids": cl["completion_ids"]})
            pair_id += 1
    return out


# --- iterative rounds: target vs comparator, index-aligned -------------------------------------


def aligned_comparisons(target: list[float], comparator: list[float], mode: str, limit: int | None,
                        rng: random.Random | None = None) -> list[tuple[int, bool]]:
    """Index-aligned pairs: target[idx] vs comparator[idx] for idx < min(P, P_c); ties dropped.

    Returns (idx, target_wins). Selection: `comparator_reward` (comparator reward, then |gap|, both
    descending), `reward_gap` (|gap| descending), `random` (seeded shuffle) or `all` (index order);
    then the first `limit` (`all` keeps every pair).
    """
    pairs = [(i, target[i], comparator[i]) for i in range(min(len(target), len(comparator)))
             if target[i] != comparator[i]]
    if mode == "comparator_reward":
        pairs.sort(key=lambda p: (p[2], abs(p[1] - p[2])), reverse=True)
    elif mode == "reward_gap":
        pairs.sort(key=lambda p: abs(p[1] - p[2]), reverse=True)
    elif mode == "random":
        (rng or random.Random(0)).shuffle(pairs)
    elif mode != "all":
        raise ValueError(f"pair_selection must be comparator_reward, reward_gap, random or all; got {mode!r}")
    if mode != "all" and limit is not None:
        pairs = pairs[:limit]
    return [(i, t > c) for i, t, c in pairs]
