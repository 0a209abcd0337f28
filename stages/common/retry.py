"""Retries with exponential backoff, for calls that may fail for a moment (a busy database, a flaky service)."""

import time
from collections.abc import Callable
from typing import Any

__all__ = ["with_retries"]


def with_retries(call: Callable[[], Any], retries: int, base_s: float, retry_if: Callable[[Exception], bool],
                 on_retry: Callable[[Exception, int, float], None] | None = None, cap_s: float = 30.0) -> Any:
    """call(), retried up to `retries` times when it raises an exception `retry_if` accepts, after base_s, 2 base_s,
    4 base_s, ... seconds (at most cap_s); `on_retry(err, attempt, wait)` is told before each wait. The last
    failure, or one not to retry, is raised as it is."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as err:
            if attempt == retries or not retry_if(err):
                raise
            wait = min(cap_s, base_s * 2 ** attempt)
            if on_retry is not None:
                on_retry(err, attempt, wait)
            time.sleep(wait)
