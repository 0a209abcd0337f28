"""Reward functions: built-ins, user functions by import path, the reference's call dispatch.

A reward function scores a *joint action* (one completion per agent) with one shared float. Its
call shape is inferred once from its signature, as CoMLRL 1.4.3 does:

- `*args`                     -> fn(c_1, ..., c_N)            (one list per agent)
- N required positionals      -> fn(c_1, ..., c_N)
- N+1 required positionals    -> fn(prompts, c_1, ..., c_N)
- 1 required positional, N>1  -> fn([c_1, ..., c_N])
- single agent: 1 -> fn(c), else fn(prompts, c)
- `batch_items=` / `prompts=` keywords are passed when declared (or when it takes **kwargs).

The result (tensor, list, tuple or scalar) is coerced to a list of floats; element 0 is the
joint action's reward. A `TypeError` falls back to fn(c_1, ..., c_N). Reward processors map every
raw reward (`scale:100`, `clamp:-1:1`, ...), as the reference's `RewardProcessors`.
"""

import functools
import inspect
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from coopflow.stages.common.user_code import load_callable

log = logging.getLogger(__name__)
HEARTBEAT_S = 10.0  # a reward call running longer says so this often (a slow reward is not a hung run)


# --- built-in rewards ----------------------------------------------------------------------------


def length_ratio(c1: list[str], c2: list[str], lo: float = 2.0, hi: float = 3.0) -> list[float]:
    """1.0 when len(c2)/len(c1) is in [lo, hi] (characters), else exp(-distance to it); 0 if c1 is empty."""
    out = []
    for a, b in zip(c1, c2):
        if len(a) == 0:
            out.append(0.0)
            continue
        r = len(b) / len(a)
        out.append(1.0 if lo <= r <= hi else math.exp(-(lo - r if r < lo else r - hi)))
    return out


length_ratio.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]

BUILTIN_REWARDS: dict[str, Callable] = {"length_ratio": length_ratio}


def resolve_reward(name: str, kwargs: dict | None = None) -> Callable:
    """Built-in reward by name, or a user function by import path, with kwargs bound."""
    fn = BUILTIN_REWARDS.get(name) or load_callable(name, "reward")
    if kwargs:
        bound = functools.partial(fn, **kwargs)
        functools.update_wrapper(bound, fn)
        return bound
    return fn


def reward_attribute(fn: Callable, name: str, default=None):
    """An attribute a reward function declares about itself (`reward_range`, `required_fields`), also through
    functools.partial; `default` when it declares none."""
    found = getattr(fn, name, None)
    return found if found is not None else getattr(getattr(fn, "func", None), name, default)


def declared_range(fn: Callable) -> tuple[float, float] | None:
    """A reward function's `reward_range` (set_reward_range), also through functools.partial; None if undeclared."""
    rng = reward_attribute(fn, "reward_range")
    return (float(rng[0]), float(rng[1])) if rng is not None else None


def reward_identity(name: str, kwargs: dict | None = None, processor: str | None = None) -> dict:
    """What a cached score depends on: name, kwargs, processor and the digest of the code the reward and the
    processor run (their modules and what those import: `code_identity.callable_identity`)."""
    from coopflow.stages.common.code_identity import callable_identity

    fn = BUILTIN_REWARDS.get(name) or load_callable(name, "reward")
    return {"name": name, "kwargs": kwargs or {}, "processor": processor, "code": callable_identity(fn),
            "processor_code": callable_identity(resolve_processor(processor))}


# --- dispatch ------------------------------------------------------------------------------------


class RewardError(TypeError, ValueError):
    """A reward function that raised, hung or returned something unusable (the message names it). A TypeError
    and a ValueError, as the plain errors these used to be."""


def _name(fn: Callable) -> str:
    target = getattr(fn, "func", fn)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(target).__name__)}"


def call_with_timeout(fn: Callable, timeout_s: float | None, what: str):
    """fn() in a daemon thread, waited for at most timeout_s seconds (None: no limit). A call still running then
    raises RewardError (its thread is abandoned: it cannot keep the process alive); Ctrl-C interrupts the wait."""
    if not timeout_s:
        return fn()
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the waiting thread
            box["error"] = err

    t = threading.Thread(target=run, name=f"coopflow-{what}", daemon=True)
    t.start()
    start = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - start)
        t.join(max(0.0, min(HEARTBEAT_S, left)))
        if not t.is_alive() or left <= HEARTBEAT_S:
            break
        log.info("%s still running after %.0f s (limit %g s, reward.timeout_s)", what, time.monotonic() - start,
                 timeout_s)
    if t.is_alive():
        raise RewardError(f"{what} did not return within {timeout_s:g} s (reward.timeout_s); it may hang or be too "
                          "slow: fix it or raise reward.timeout_s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class RewardCaller:
    """Calls a reward function with the shape its signature asks for (resolved once), each call limited to
    `timeout_s` seconds."""

    def __init__(self, fn: Callable, num_agents: int, timeout_s: float | None = None, retries: int = 0):
        self.fn, self.n, self.timeout_s, self.retries = fn, num_agents, timeout_s, retries
        self.name = _name(fn)
        self.executor = None  # stages.score.executors: set to fan calls out (reward.workers > 1)
        self.seconds = 0.0  # wall time spent in reward calls (the sandbox / simulator / service they wait on)

        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        kinds = inspect.Parameter
        self.varargs = any(p.kind == kinds.VAR_POSITIONAL for p in params)
        self.varkw = any(p.kind == kinds.VAR_KEYWORD for p in params)
        names = {p.name for p in params}
        self.positional = sum(1 for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
                              and p.default is inspect.Parameter.empty)
        self.wants_items = "batch_items" in names or self.varkw
        self.wants_prompts_kw = "prompts" in names or self.varkw

    def _guarded(self, call: Callable):
        """call() under the timeout, retried `retries` times with backoff when it raises (not when it hangs)."""
        from coopflow.stages.common.retry import with_retries

        def told(err: Exception, attempt: int, wait: float) -> None:
            log.warning("reward function %s raised %s: %s; retry %d of %d in %.1f s",
                                                         self.name, err.__class__.__name__, err, attempt + 1,
                                                         self.retries, wait)

        return with_retries(lambda: call_with_timeout(call, self.timeout_s, f"reward function {self.name}"),
                            self.retries, 0.5, lambda err: not isinstance(err, RewardError), told)

    def _args(self, per_agent: list[list[str]], prompts: list[str]) -> tuple[list, bool]:
        """Positional args and whether prompts went positionally."""
        if self.varargs:
            return list(per_agent), False
        if self.n == 1:
            return ([per_agent[0]], False) if self.positional <= 1 else ([prompts, per_agent[0]], True)
        if self.positional == self.n + 1:
            return [prompts, *per_agent], True
        if self.positional == 1:
            return [list(per_agent)], False
        return list(per_agent), False

    def _prepare(self, per_agent: list[list[str]], prompts: list[str], items: list[dict],
                 cross: bool = False) -> tuple[tuple, dict, tuple]:
        """(args, kwargs, fallback args) of one call: the reference's dispatch, decided here, run anywhere."""
        if cross:  # cross mode calls the function directly: only batch_items is detected; the fallback is one
            #        list of the N strings
            kw = {"batch_items": items} if "batch_items" in _param_names(self.fn) else {}
            return tuple(per_agent), kw, ([c[0] for c in per_agent],)
        args, prompts_positional = self._args(per_agent, prompts)
        kw: dict[str, Any] = {}
        if self.wants_items:
            kw["batch_items"] = items
        if self.wants_prompts_kw and not prompts_positional and ("prompts" not in kw):
            kw["prompts"] = prompts
        return tuple(args), kw, tuple(per_agent)

    def call(self, per_agent: list[list[str]], prompts: list[str], items: list[dict],
             cross: bool = False) -> list[float]:
        """One call here, in this process (under the timeout, with the opted-in retries), its wall time counted in
        `seconds`; `cross`: the cross-mode call shape."""
        from coopflow.stages.score.executors import invoke

        args, kw, fallback = self._prepare(per_agent, prompts, items, cross)
        t0 = time.perf_counter()
        try:
            out = self._guarded(lambda: invoke(self.fn, args, kw, fallback))
        finally:
            self.seconds += time.perf_counter() - t0
        return to_floats(out, self.name)

    def __call__(self, per_agent: list[list[str]], prompts: list[str], items: list[dict]) -> list[float]:
        """Score joint action(s): per_agent[i] is agent i's list of completions (aligned by index)."""
        return self.call(per_agent, prompts, items)

    def call_cross(self, per_agent: list[list[str]], items: list[dict]) -> list[float]:
        """Cross mode calls the function directly: only batch_items is detected; a TypeError retries with one
        list of the N strings."""
        return self.call(per_agent, [], items, cross=True)

    def map(self, calls: list[tuple], unit: str = "joint actions"):
        """Score many calls `(per_agent, prompts, items, cross)`; yields, in order, each call's floats or a
        `Failed` holding its error. Serial (and lazy: the caller may stop at the first failure) unless an
        executor is set (`reward.workers` > 1), which runs them concurrently (scores identical to serial).
        A long scoring logs its progress every few seconds (`stages.common.progress`): calls scored of all,
        counted in `unit`, and their rate."""
        from coopflow.stages.common.progress import Heartbeat

        beat = Heartbeat(log, f"score {self.name}", len(calls), unit)
        for n, res in enumerate(self._map(calls, beat.tick), 1):
            if n == len(calls):  # callers stop pulling after the last result: say done before yielding it
                beat.done(n)
            else:
                beat.tick(n)
            yield res

    def _map(self, calls: list[tuple], progress):
        from coopflow.stages.score.executors import CallTimeout, Failed, picklable, serial

        ex = self.executor
        if ex is not None and ex.name == "process" and not picklable(self.fn):
            if not getattr(self, "_told", False):
                log.warning("reward function %s cannot be sent to worker processes (not importable by name: a lambda "
                            "or closure?); scoring serially", self.name)
                self._told = True
            ex = None
        if ex is None:
            yield from serial(self.call, calls)
            return
        jobs = [(self.fn, *self._prepare(pa, pr, it, cross)) for pa, pr, it, cross in calls]
        t0 = time.perf_counter()
        try:
            results = ex.map(jobs, self.timeout_s, progress)
        finally:
            self.seconds += time.perf_counter() - t0
        for call, res in zip(calls, results):
            if isinstance(res, Failed) and isinstance(res.error, CallTimeout):
                yield Failed(RewardError(f"reward function {self.name} did not return within {self.timeout_s:g} s "
                                         "(reward.timeout_s); it may hang or be too slow: fix it or raise "
                                         "reward.timeout_s"))
                return
            if isinstance(res, Failed) and self.retries:  # opted in: retried here, with backoff
                yield from serial(self.call, [call])
                continue
            if isinstance(res, Failed):
                yield res
                continue
            try:
                yield to_floats(res, self.name)
            except Exception as err:
                yield Failed(err)


def _param_names(fn: Callable) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def to_floats(out: Any, name: str | None = None) -> list[float]:
    """Coerce a reward function's output to a list of floats (`name` goes into the errors)."""
    who = f"reward function {name}" if name else "reward function"
    if hasattr(out, "detach"):
        out = out.detach().cpu().reshape(-1).tolist()
    elif hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()  # numpy scalars and arrays
    if isinstance(out, (int, float)):
        return [float(out)]
    if isinstance(out, (str, bytes)):
        raise RewardError(f"{who} returned {out!r} ({type(out).__name__}); expected a float or a list of floats")
    try:
        vals = [float(x) for x in out]
    except (TypeError, ValueError):
        raise RewardError(f"{who} returned {repr(out)[:200]} ({type(out).__name__}); expected a float or a list of "
                          "floats") from None
    if not vals:
        raise RewardError(f"{who} returned an empty list; expected one float per joint action")
    return vals


# --- reward processors ---------------------------------------------------------------------------


def _exp_scale(factor: float, x: float) -> float:
    return math.exp(factor * x) - 1 if x > 0 else -math.exp(-factor * x) + 1


def resolve_processor(spec: str | None) -> Callable[[float], float]:
    """Parse a processor spec: identity | clamp:MIN:MAX | scale:F | shift:V | sigmoid_scale | exponential_scale:F |
    normalize_by_length:MAX (no length known at score time: identity) | 'module:function'."""
    if spec is None or spec == "identity":
        return lambda x: x
    name, *args = spec.split(":")
    try:
        nums = [float(a) for a in args]
    except ValueError:
        nums = None
    if nums is not None:
        if name == "scale" and len(nums) == 1:
            return lambda x, f=nums[0]: x * f
        if name == "shift" and len(nums) == 1:
            return lambda x, v=nums[0]: x + v
        if name == "clamp" and len(nums) in (0, 2):
            lo, hi = nums if nums else (-10.0, 10.0)
            return lambda x: min(hi, max(lo, x))
        if name == "sigmoid_scale" and not nums:
            return lambda x: 1.0 / (1.0 + math.exp(-x))
        if name == "exponential_scale" and len(nums) == 1:
            return functools.partial(_exp_scale, nums[0])
        if name == "normalize_by_length" and len(nums) <= 1:
            return lambda x: x
    if ":" in spec and nums is None:
        return load_callable(spec, "reward processor")
    raise ValueError(f"unknown reward processor {spec!r}; use identity, clamp:MIN:MAX, scale:F, shift:V, sigmoid_scale, "
                     f"exponential_scale:F, normalize_by_length:MAX or 'module:function'")
