"""Transitions: the environment step that turns one turn's joint answer into the next turn's prompts.

The keyword contract (as in CoMLRL 1.4.3): a transition is called as

    transition(prompt=item_prompt, agent_completions=[one str per agent], num_agents=N,
               prompt_history_per_agent=[[str, ...] per agent], response_history_per_agent=[[...] per agent])

and returns a list/tuple of N prompts, one per agent. The histories run along the branch and
include the current turn (the prompts actually used and the completions chosen). Only those
keywords are passed; anything else is bound with `transition.kwargs`. coopflow adds two opt-in
keywords: a transition that declares `reward` also receives the joint action's (processed) score, one that
declares `item` the task item (its fields: e.g. a coding problem's tests). A transition may also be a
class: it is constructed once per run with `transition.kwargs` and its instance is called per branch (for
state such as a loaded expert model, e.g. `coopflow.envs.expert:ExpertEdits`).

Rewards of multi-turn episodes see, in their `batch_items`, the task item plus `_turn` (0-based) and
`_history` (per agent, the answers of the earlier turns along the branch), so a stateful environment (a
simulator) can replay each branch from its start instead of sharing state between branches.

Built-ins:
- `plain`:    the original prompt, the previous answers, and an instruction to revise;
- `feedback`: the same plus the team's score and each answer's length in characters, so each agent
              knows how the joint answer did and what to change.
"""

import functools
import inspect
from collections.abc import Callable

from coopflow.stages.common.user_code import load_callable

# --- built-ins -----------------------------------------------------------------------------------


def _previous(agent_completions: list[str], with_lengths: bool = False) -> str:
    parts = []
    for i, c in enumerate(agent_completions):
        size = f" ({len(c)} chars)" if with_lengths else ""
        parts.append(f"agent {i + 1}{size}: {c}")
    return " | ".join(parts)


def plain(*, prompt: str, agent_completions: list[str], num_agents: int, prompt_history_per_agent=None,
          response_history_per_agent=None, instruction: str = "Revise your answer.") -> list[str]:
    """Show every agent the previous joint answer and ask it to revise (the same prompt for all agents)."""
    text = f"{prompt}\nPrevious answers: {_previous(agent_completions)}\n{instruction}"
    return [text] * num_agents


def feedback(*, prompt: str, agent_completions: list[str], num_agents: int, prompt_history_per_agent=None,
             response_history_per_agent=None, reward: float | None = None, best: float = 1.0,
             instruction: str = "Change your answer so the team scores higher.") -> list[str]:
    """Tell each agent its role, the team's score (out of `best`) and the answers' lengths, then ask to improve."""
    score = f"Team score: {reward:.2f} of {best:g}. " if reward is not None else ""
    prev = _previous(agent_completions, with_lengths=True)
    return [f"{prompt}\nPrevious answers: {prev}\n{score}You are agent {i + 1}. {instruction}"
            for i in range(num_agents)]


BUILTIN_TRANSITIONS: dict[str, Callable] = {"plain": plain, "feedback": feedback}


# --- calling -------------------------------------------------------------------------------------


class Transition:
    """A resolved transition: call it per branch with the reference's keywords; validates the result."""

    def __init__(self, name: str, kwargs: dict | None = None):
        fn = BUILTIN_TRANSITIONS.get(name) or load_callable(name, "transition")
        self.name = name
        if inspect.isclass(fn):  # a stateful transition: built once with the kwargs, its instance called per branch
            try:
                fn = fn(**(kwargs or {}))
            except TypeError as err:
                raise ValueError(f"transition {name!r}: bad transition.kwargs: {err}") from None
            kwargs = None
        self.fn = functools.partial(fn, **kwargs) if kwargs else fn
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        self.wants_reward = "reward" in params and "reward" not in (kwargs or {})
        self.wants_item = "item" in params and "item" not in (kwargs or {})

    def __call__(self, prompt: str, agent_completions: list[str], prompt_history: list[list[str]],
                 response_history: list[list[str]], reward: float | None = None, item: dict | None = None) -> list[str]:
        n = len(agent_completions)
        extra = {"reward": reward} if self.wants_reward else {}
        if self.wants_item:
            extra["item"] = {k: v for k, v in (item or {}).items() if not k.startswith("_")}
        out = self.fn(prompt=prompt, agent_completions=list(agent_completions), num_agents=n,
                      prompt_history_per_agent=[list(h) for h in prompt_history],
                      response_history_per_agent=[list(h) for h in response_history], **extra)
        if not isinstance(out, (list, tuple)) or len(out) != n:
            got = f"{type(out).__name__} of length {len(out)}" if isinstance(out, (list, tuple)) else repr(out)[:80]
            raise ValueError(f"transition {self.name!r} must return a list of {n} prompts (one per agent), got {got}")
        if not all(isinstance(p, str) for p in out):
            raise ValueError(f"transition {self.name!r} must return strings, got {[type(p).__name__ for p in out]}")
        return list(out)


def transition_identity(name: str, kwargs: dict | None = None) -> dict:
    """What a cached multi-turn rollout depends on: the transition's name, kwargs and the digest of the code it runs
    (`code_identity.callable_identity`)."""
    from coopflow.stages.common.code_identity import callable_identity

    fn = BUILTIN_TRANSITIONS.get(name) or load_callable(name, "transition")
    return {"name": name, "kwargs": kwargs or {}, "code": callable_identity(fn)}
