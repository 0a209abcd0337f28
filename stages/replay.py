"""Stage: preference replay — which earlier rounds' pairs a round trains on (spec §4.4 step 5, §6.6).

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

REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


def check_replay(mode: str, k: int | None, lam: float | None, sample_size: int | None) -> None:
    """The reference's replay-argument rules; ValueError names the field."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"preference_replay_mode must be one of {', '.join(REPLAY_MODES)}; got {mode!r}")
    if sample_size is not None and sample_size < 1:
        raise ValueError("preference_replay_sample_size must be >= 1 or null")
    if mode == "current":
        if k not in (None, 1) or lam is not None or sample_size is not None:
            raise ValueError("preference_replay_mode 'current' takes no preference_replay_lambda or "
                             "preference_replay_sample_size, and preference_replay_k only as null or 1")
    elif mode == "nearest_k":
        if k is None or k < 1:
            raise ValueError("preference_replay_mode 'nearest_k' requires preference_replay_k >= 1")
        if lam is not None:
            raise ValueError("preference_replay_mode 'nearest_k' does not take preference_replay_lambda")
    elif mode == "all_history":
        if k is not None or lam is not None:
            raise ValueError("preference_replay_mode 'all_history' takes neither preference_replay_k nor "
                             "preference_replay_lambda")
    elif mode == "lambda_decay":
        if lam is None or not 0.0 <= lam <= 1.0:
            raise ValueError("preference_replay_mode 'lambda_decay' requires preference_replay_lambda in [0, 1]")
        if k is not None:
            raise ValueError("preference_replay_mode 'lambda_decay' does not take preference_replay_k")


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
