"""The live resources of one run, apart from its (immutable) plan.

A `Session` holds what a run creates while it runs and what must not leak into the next run:

- `live`: the policies left in memory by the last segment or round, valid for exactly one
  checkpoint key, so the next segment continues from them instead of reloading the checkpoint that
  was just written (and mp worker processes are started once per run, not once per segment);
- `calls`: how many times each stage body actually ran (generate, score, advantages, update,
  evaluate, checkpoint, ...); cached stages do not count. The run summary's `executed` is this.

Every run gets its own session (`make_context` creates one unless it is handed the parent run's, as
MARLHF's RL phase is); `close()` stops whatever the policies it opened hold (worker processes, Ray actors),
whichever path the run took: a stage that fails while it holds policies it took from `live` leaves them to
`close()`, which the run driver calls on success and failure alike.
"""

import weakref
from collections import Counter
from dataclasses import dataclass, field


class LivePolicies:
    """One live policy group, valid for exactly one checkpoint key (in-process reuse)."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.policies = None

    def take(self, key: str):
        """The live policies if they are exactly checkpoint `key` (the caller now owns them), else None."""
        if self.key == key and self.policies is not None:
            pol, self.key, self.policies = self.policies, None, None
            return pol
        return None

    def peek(self, key: str):
        """The live policies if they are checkpoint `key`, still owned by the cache; else None."""
        return self.policies if self.key == key else None

    def put(self, key: str, policies) -> None:
        """Keep `policies` as checkpoint `key` (closing whatever was kept before)."""
        if self.policies is not None and self.policies is not policies:
            self.policies.close()
        self.key, self.policies = key, policies

    def clear(self) -> None:
        """Drop (and close) the kept policies."""
        if self.policies is not None:
            self.policies.close()
        self.key, self.policies = None, None


@dataclass
class Session:
    """Mutable per-run resources: the live-policy cache and the stage-body counters."""

    live: LivePolicies = field(default_factory=LivePolicies)
    calls: Counter = field(default_factory=Counter)
    initial: object | None = None  # live policies to start from instead of loading the sources (the Python API's
    #                                in-memory agents: trained in place, as the reference trains its agents) ...
    initial_sources: tuple = ()  # ... by a context whose (resolved) sources are these, i.e. the same weights
    closers: list = field(default_factory=list)  # what else the run started (reward executors' pools/clusters)
    rebuild: set = field(default_factory=set)  # segment indices to re-run (replay) although stored weights-only
    opened: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)  # every policy group
    #                                this session loaded, by id (weakly: a group nothing uses any more is freed)

    def own(self, policies):
        """Record `policies` as loaded by this run: `close()` stops them if nothing did before. Returns them."""
        self.opened[id(policies)] = policies
        return policies

    def executed(self) -> dict[str, int]:
        """Stage bodies that ran in this session, by name (what the run summary reports)."""
        return {k: v for k, v in self.calls.items() if v}

    def close(self) -> None:
        """Release the live policies and every other group this session loaded (stops mp worker processes / Ray
        actors; closing is idempotent), never the caller's `initial` agents, then the reward executors."""
        self.live.clear()
        for pol in list(self.opened.values()):
            if pol is not self.initial:
                pol.close()
        self.opened.clear()
        while self.closers:
            self.closers.pop()()
