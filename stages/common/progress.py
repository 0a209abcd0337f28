"""Signs of life inside long stages, and log lines that do not break progress bars.

- `Heartbeat`: a stage calls `tick(n)` as its work advances (a decode step, a scored joint action); every
  `HEARTBEAT_S` seconds it logs `what: n/total unit, rate unit/s, elapsed` at INFO. Until then a tick costs one
  clock read, so it can sit in a per-token loop. A stage shorter than the interval logs nothing; one that
  logged a beat also logs a last line when it is `done`.
- `bar_safe_logging()`: while a tqdm bar is drawn, the console handlers of the root logger and of every
  other logger (Prefect's included) write through `tqdm.write`, which clears the bar, prints the line and
  draws the bar again, so a log line never lands in the middle of a bar.

Heartbeats log to `stages.*` loggers; `flows.env.configure` sets that tree to INFO so a flow run shows
them (Prefect's console otherwise shows WARNING and up). Agent worker processes send their log records to
the main process (`stages.agents.workers`), which logs them there.
"""

import logging
import sys
import time
from contextlib import contextmanager

HEARTBEAT_S = 5.0
"""Seconds between two heartbeat lines of one running stage (agent worker processes get the main process's
value when they start)."""


class Heartbeat:
    """Logs the progress of one stage every `interval` seconds (default `HEARTBEAT_S`) while it runs."""

    def __init__(self, logger: logging.Logger, what: str, total: int, unit: str, width: int = 1,
                 interval: float | None = None):
        self.log, self.what, self.total, self.unit, self.width = logger, what, total, unit, width
        self.interval = HEARTBEAT_S if interval is None else interval
        self.t0 = time.monotonic()
        self.next = self.t0 + self.interval
        self.beats = 0

    def tick(self, n: int) -> None:
        """`n` of `total` done: a beat when the interval has passed (else one clock read)."""
        now = time.monotonic()
        if now >= self.next:
            self._say(n, now, "")
            self.next = now + self.interval

    def done(self, n: int) -> None:
        """The stage finished with `n` done: a last line, when it logged a beat (a short stage stays quiet)."""
        if self.beats:
            self._say(n, time.monotonic(), "done, ")

    def _say(self, n: int, now: float, prefix: str) -> None:
        self.beats += 1
        elapsed = now - self.t0
        rate = n * self.width / elapsed if elapsed > 0 else 0.0
        across = f" × {self.width} sequences" if self.width > 1 else ""
        self.log.info("%s: %s%d/%d %s%s, %.1f %s/s, %.1f s", self.what, prefix, n, self.total, self.unit, across,
                      rate, self.unit, elapsed)


def _is_console(handler: logging.Handler) -> bool:
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, _BarSafeHandler)
            and getattr(handler, "stream", None) in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__))


class _BarSafeHandler(logging.Handler):
    """Stands in for a console handler while bars are drawn: its formatter, level and filters, via tqdm.write."""

    def __init__(self, inner: logging.StreamHandler):
        super().__init__(inner.level)
        self.inner = inner
        self.setFormatter(inner.formatter)
        self.filters = list(inner.filters)

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.inner.stream)
        except Exception:
            self.handleError(record)


@contextmanager
def bar_safe_logging(enabled: bool = True):
    """Within the block, every console log handler writes through `tqdm.write` (restored afterwards)."""
    if not enabled:
        yield
        return
    loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    swapped = []
    for lg in loggers:
        if any(_is_console(h) for h in lg.handlers):
            swapped.append((lg, lg.handlers))
            lg.handlers = [_BarSafeHandler(h) if _is_console(h) else h for h in lg.handlers]
    try:
        yield
    finally:
        for lg, handlers in swapped:
            lg.handlers = handlers
