"""Centralized collaboration: one joint actor writes every role's output in one completion.

In the decentralized setting each of N agents is its own LM with its own prompt. In the centralized
setting (CoMLRL 1.4.3's "centralized multi-agent system training") there is **one** actor: an adapter
folds the N role prompts into one joint prompt, the actor writes one joint completion, and the adapter
splits it back into N role outputs, which the task reward (and the evaluation hooks) see exactly as if
N agents had written them. Nothing else changes: the rollout tree, baselines, DPO and the reward model
all run with a single policy, and the loss is the joint sequence log-prob (every joint token, role
tags and the final EOS included).

An adapter is any object with

    build_prompt(batch_item, agent_prompts) -> str                   (non-empty)
    parse_completion(completion, batch_item, num_agents) -> [str]*N  (raise CentralizedComparatorParseError)

and optionally, for `comparator_generation_mode: centralized_sequential`,

    build_sequential_prompt(batch_item, agent_prompts, agent_idx, previous_outputs) -> str
    parse_sequential_completion(completion, batch_item, agent_idx) -> str

The default, `TaggedAdapter`, is domain-neutral: it lists the role prompts and asks for
`<agent_i>...</agent_i>` sections (matched case-insensitively; a missing section is "", no section
at all is a parse error). A parse error gives every role "", so the task reward is typically 0; the
run counts such completions (`centralized/parse_failure_rate`).
"""

import re
from collections.abc import Callable, Sequence

from coopflow.schemas.config import COLLABORATION_ALIASES, GENERATION_ALIASES  # noqa: F401 (re-exported)
from coopflow.stages.score.rewards import declared_range

__all__ = ["CentralizedComparatorParseError", "TaggedAdapter", "DelimitedAdapter", "load_adapter", "adapter_identity", "split_roles",
           "JointFormatter", "CentralizedReward", "RoleSplitLogger", "parse_failures", "COLLABORATION_ALIASES",
           "GENERATION_ALIASES"]


class CentralizedComparatorParseError(ValueError):
    """A joint completion the adapter cannot split into role outputs."""


# --- the default adapter -----------------------------------------------------------------------------


class TaggedAdapter:
    """Role prompts in, `<agent_i>...</agent_i>` sections out (any N, no domain words)."""

    def build_prompt(self, batch_item: dict, agent_prompts: Sequence[str]) -> str:
        n = len(agent_prompts)
        parts = [f"You coordinate a team of {n} agents and write the separate output of each of them. Every "
                 "agent has its own original prompt:", ""]
        for i, p in enumerate(agent_prompts):
            parts += [f"Agent {i} original prompt:", str(p), ""]
        tags = " ".join(f"<agent_{i}>...</agent_{i}>" for i in range(n))
        parts.append(f"Answer with exactly one section per agent, in order, and nothing outside them: {tags}")
        return "\n".join(parts)

    def parse_completion(self, completion: str, batch_item: dict, num_agents: int) -> list[str]:
        found, out = False, []
        for i in range(num_agents):
            m = re.search(rf"<agent_{i}>(.*?)</agent_{i}>", completion, flags=re.IGNORECASE | re.DOTALL)
            found |= m is not None
            out.append(m.group(1).strip() if m else "")
        if not found:
            raise CentralizedComparatorParseError(
                f"no <agent_i>...</agent_i> section in the joint completion ({len(completion)} chars)")
        return out

    def build_sequential_prompt(self, batch_item: dict, agent_prompts: Sequence[str], agent_idx: int,
                                previous_outputs: Sequence[str]) -> str:
        parts = [f"You coordinate a team of {len(agent_prompts)} agents and now write the output of agent "
                 f"{agent_idx}."]
        for i, out in enumerate(previous_outputs):
            parts += ["", f"Agent {i} already wrote:", str(out)]
        parts += ["", f"Agent {agent_idx} original prompt:", str(agent_prompts[agent_idx]), "",
                  f"Answer inside <agent_{agent_idx}>...</agent_{agent_idx}>."]
        return "\n".join(parts)

    def parse_sequential_completion(self, completion: str, batch_item: dict, agent_idx: int) -> str:
        m = re.search(rf"<agent_{agent_idx}>(.*?)(?:</agent_{agent_idx}>|$)", completion,
                      flags=re.IGNORECASE | re.DOTALL)
        return (m.group(1) if m else completion).strip()


class DelimitedAdapter:
    """Roles as parts of the joint completion separated by `separator` (default a blank line): easier for small
    models than tags. Part i is role i; the last role takes any extra parts; missing parts are ""; a completion
    with no text at all is a parse error."""

    def __init__(self, separator: str = "\n\n"):
        if not separator:
            raise ValueError("DelimitedAdapter needs a non-empty separator")
        self.separator = separator

    def build_prompt(self, batch_item: dict, agent_prompts: Sequence[str]) -> str:
        n = len(agent_prompts)
        sep = "a blank line" if self.separator == "\n\n" else repr(self.separator)
        parts = [f"Write {n} parts, one per task below, in order, separated by {sep}. Write nothing else.", ""]
        for i, p in enumerate(agent_prompts):
            parts += [f"Task {i + 1}:", str(p), ""]
        return "\n".join(parts).rstrip()

    def parse_completion(self, completion: str, batch_item: dict, num_agents: int) -> list[str]:
        parts = [p.strip() for p in completion.split(self.separator) if p.strip()]
        if not parts:
            raise CentralizedComparatorParseError("empty joint completion")
        head, tail = parts[:num_agents - 1], parts[num_agents - 1:]
        out = head + [self.separator.join(tail)] if tail else head
        return out + [""] * (num_agents - len(out))


# --- loading and identity ------------------------------------------------------------------------


def load_adapter(spec: str | None, kwargs: dict | None = None):
    """The adapter a config names: null = TaggedAdapter; 'module:Class' (built with kwargs) or 'module:obj'."""
    if spec is None or spec in ("tagged", "TaggedAdapter"):
        return TaggedAdapter()
    from coopflow.stages.common.user_code import load_callable

    obj = load_callable(spec, "centralized adapter")
    if isinstance(obj, type):
        obj = obj(**(kwargs or {}))
    check_adapter(obj, spec)
    return obj


def check_adapter(obj, what: str = "adapter", sequential: bool = False) -> None:
    """Refuse an object without the adapter methods (build_prompt, parse_completion[, the sequential pair])."""
    need = ["build_prompt", "parse_completion"]
    if sequential:
        need += ["build_sequential_prompt", "parse_sequential_completion"]
    missing = [m for m in need if not callable(getattr(obj, m, None))]
    if missing:
        raise ValueError(f"centralized adapter {what!r} needs callable {', '.join(missing)}")


def adapter_identity(spec: str | None, kwargs: dict | None = None) -> dict:
    """What keys depend on: the adapter's name, kwargs and the digest of the code it runs."""
    from coopflow.stages.common.code_identity import callable_identity

    obj = load_adapter(spec, kwargs)
    return {"adapter": spec or "tagged", "kwargs": kwargs or {}, "code": callable_identity(obj)}


def split_roles(adapter, completion: str, item: dict, n: int) -> tuple[list[str], bool]:
    """(N role outputs, parsed): a parse error gives N empty outputs; a wrong count is the adapter's bug."""
    try:
        roles = list(adapter.parse_completion(completion, item, n))
    except CentralizedComparatorParseError:
        return [""] * n, False
    if len(roles) != n:
        raise ValueError(f"centralized adapter {type(adapter).__name__}.parse_completion must return exactly {n} "
                         f"outputs, got {len(roles)}")
    return [str(r) for r in roles], True


def parse_failures(adapter, texts: Sequence[str], items: Sequence[dict], n: int) -> int:
    """How many joint completions the adapter could not parse."""
    return sum(not split_roles(adapter, t, it, n)[1] for t, it in zip(texts, items))


# --- the pieces a run swaps in -------------------------------------------------------------------------


class JointFormatter:
    """The joint actor's formatter: adapter.build_prompt(item, [role formatter_i(item)]), then `wrap`
    (e.g. the actor's chat template) around the joint prompt."""

    def __init__(self, adapter, role_formatters: Sequence[Callable[[dict], str]],
                 wrap: Callable[[str], str] | None = None):
        self.adapter, self.roles, self.wrap = adapter, list(role_formatters), wrap

    def __call__(self, item: dict) -> str:
        joint = self.adapter.build_prompt(item, [f(item) for f in self.roles])
        if not isinstance(joint, str) or not joint:
            raise ValueError(f"centralized adapter {type(self.adapter).__name__}.build_prompt must return a "
                             "non-empty string")
        return self.wrap(joint) if self.wrap else joint


class CentralizedReward:
    """The joint actor's reward: split each joint completion into roles and score them with the task reward
    (called with N one-element lists and role 0's prompt, exactly one value back). Carries the task reward's
    `reward_range`."""

    def __init__(self, task_caller, adapter, prompt_of: Callable[[dict], str]):
        self.task, self.adapter, self.prompt_of = task_caller, adapter, prompt_of
        rng = declared_range(task_caller.fn)
        if rng is not None:
            self.reward_range = rng

    def __call__(self, completions: list[str], batch_items: list[dict] | None = None) -> list[float]:
        items = batch_items or [{} for _ in completions]
        out = []
        for text, item in zip(completions, items):
            roles, _ = split_roles(self.adapter, text, item, self.task.n)
            vals = self.task([[r] for r in roles], [self.prompt_of(item)], [item])
            if len(vals) != 1:
                raise ValueError(f"the task reward must return exactly one value per joint action in centralized "
                                 f"mode, got {len(vals)}")
            out.append(vals[0])
        return out


class RoleSplitLogger:
    """An eval_logger seen through the joint actor: its one 'agent' of joint completions is split into the N
    role outputs before the user's logger runs (so a decentralized logger works unchanged)."""

    def __init__(self, logger: Callable, adapter, n: int):
        import inspect

        self.logger, self.adapter, self.n = logger, adapter, n
        try:
            self.wants_items = "items" in inspect.signature(logger).parameters
        except (TypeError, ValueError):
            self.wants_items = False

    def __call__(self, agent_completions_turns, test_cases, entry_points, prompts, items=None):
        joint = agent_completions_turns[0]  # [path][turn]
        split = [[[] for _ in joint] for _ in range(self.n)]
        for p, turns in enumerate(joint):
            item = items[p] if items else {}
            for text in turns:
                roles, _ = split_roles(self.adapter, text, item, self.n)
                for a in range(self.n):
                    split[a][p].append(roles[a])
        kw = {"items": items} if self.wants_items else {}
        return self.logger(agent_completions_turns=split, test_cases=test_cases, entry_points=entry_points,
                           prompts=prompts, **kw)
