"""Stage: preference replay — which earlier rounds' pairs a round trains on.

Every round writes its pairs as a replay shard (oldest first). The training pairs of a round are
sampled from the shards by `preference_replay_mode`:

- `current`:      this round's shard only;
- `nearest_k`:    the last k shards, uniformly;
- `all_history`:  every shard, uniformly;
- `lambda_decay`: shard weight ∝ (1 − λ)·λ^age (age 0 = newest; λ = 1 → uniform).

Sample size = `preference_replay_sample_size`, else this round's pair count, else the last
non-empty shard's. Each draw picks a shard with `random.choices(weights)`; records within a shard
are drawn without replacement, cycling through a fresh shuffled pass when more are needed; the
result is shuffled. Everything is seeded, so a round's training pairs are reproducible.
"""

import random

from coopflow.schemas.config import REPLAY_MODES, check_replay  # noqa: F401  (the rules live with the config)


def shard_weights(n_shards: int, mode: str, k: int | None = None, lam: float | None = None) -> list[float]:
    """Sampling weight of every shard (oldest first); zero for shards a mode never samples."""
    if n_shards == 0:
        return []
    if mode == "current":
        return [0.0] * (n_shards - 1) + [1.0]
    if mode == "nearest_k":
        keep = min(k or 1, n_shards)
        return [0.0] * (n_shards - keep) + [1.0] * keep
    if mode == "all_history":
        return [1.0] * n_shards
    if mode == "lambda_decay":
        if lam == 1.0:
            return [1.0] * n_shards
        return [(1.0 - lam) * lam ** (n_shards - 1 - i) for i in range(n_shards)]
    raise ValueError(f"unknown preference_replay_mode {mode!r}")


def sample_replay(shards: list[list], mode: str, k: int | None, lam: float | None, sample_size: int | None,
                  rng: random.Random) -> list:
    """Training records for this round; `shards` oldest first, the last one this round's."""
    if not shards:
        return []
    current = len(shards[-1])
    if mode == "current":
        out = list(shards[-1])
        rng.shuffle(out)
        return out
    size = sample_size or current or next((len(s) for s in reversed(shards) if s), 0)
    weights = [w if shards[i] else 0.0 for i, w in enumerate(shard_weights(len(shards), mode, k, lam))]
    if size == 0 or sum(weights) == 0:
        return []
    pools: dict[int, list] = {}
    out = []
    for _ in range(size):
        i = rng.choices(range(len(shards)), weights=weights)[0]
        if not pools.get(i):  # without replacement; a fresh shuffled pass when the shard is used up
            pools[i] = list(shards[i])
            rng.shuffle(pools[i])
        out.append(pools[i].pop())
    rng.shuffle(out)
    return out
