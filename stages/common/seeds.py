"""Seeds derived from named parts, so sampling never depends on a global RNG stream.

A run's randomness is keyed by what it is for: `derive_seed(seed, update, turn, agent)` seeds one
agent's sampling at one update, `derive_seed(seed, "dpo-shuffle")` a shuffle. The same parts give the
same seed in every process (unlike `hash()`), which is what makes resumed and multi-process runs equal
to uninterrupted in-process ones.
"""

import hashlib


def derive_seed(*parts) -> int:
    """A 63-bit seed from any parts (stable across processes, unlike hash())."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1
