"""`RewardProcessors`: CoMLRL 1.4.3's reward post-processors (applied to every raw reward), as coopflow processor specs.

Each factory returns a callable float -> float that also carries `.spec`, the string coopflow's configs
use (`reward.processor`), so a trainer given `RewardProcessors.scale(10)` and a flow given
`processor: scale:10` share artifact keys.
"""

import math

from coopflow.stages.score.rewards import resolve_processor

__all__ = ["RewardProcessors"]


class _Processor:
    def __init__(self, spec: str):
        self.spec = spec
        self._fn = resolve_processor(spec)

    def __call__(self, x: float, length: int | None = None) -> float:
        return self._fn(x)

    def __repr__(self) -> str:
        return f"RewardProcessor({self.spec!r})"


class _LengthNormalized(_Processor):
    """normalize_by_length: reward × min(1, length / max_len) when a length is given."""

    def __init__(self, max_len: int):
        super().__init__(f"normalize_by_length:{max_len}")
        self.max_len = max_len

    def __call__(self, x: float, length: int | None = None) -> float:
        return x if length is None else x * min(1.0, length / self.max_len)


class RewardProcessors:
    """Factories of reward processors, named as in CoMLRL."""

    @staticmethod
    def identity() -> _Processor:
        return _Processor("identity")

    @staticmethod
    def clamp(min: float = -10.0, max: float = 10.0) -> _Processor:  # noqa: A002 (the reference's names)
        if not min < max:
            raise ValueError(f"clamp needs min < max, got {min} and {max}")
        return _Processor(f"clamp:{float(min)}:{float(max)}")

    @staticmethod
    def scale(factor: float = 1.0) -> _Processor:
        return _Processor(f"scale:{float(factor)}")

    @staticmethod
    def shift(value: float = 0.0) -> _Processor:
        return _Processor(f"shift:{float(value)}")

    @staticmethod
    def sigmoid_scale() -> _Processor:
        return _Processor("sigmoid_scale")

    @staticmethod
    def exponential_scale(factor: float) -> _Processor:
        if not math.isfinite(factor):
            raise ValueError("exponential_scale needs a finite factor")
        return _Processor(f"exponential_scale:{float(factor)}")

    @staticmethod
    def normalize_by_length(max_len: int = 1000) -> _Processor:
        if max_len <= 0:
            raise ValueError("normalize_by_length needs max_len > 0")
        return _LengthNormalized(max_len)
