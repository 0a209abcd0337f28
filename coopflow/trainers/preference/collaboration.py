"""`CentralizedCollaboration` (CoMLRL's `comlrl.trainers.preference.collaboration`): the environment boundary of
centralized collaboration, where the joint actor's completions become the N role outputs the task sees."""

import copy
from collections.abc import Callable, Sequence

from coopflow.stages.score.rewards import RewardCaller
from coopflow.stages.tasks.centralized import CentralizedReward, JointFormatter, split_roles

__all__ = ["CentralizedCollaboration"]


class CentralizedCollaboration:
    """Wraps the task reward and formatters for one joint actor writing `num_roles` roles through `adapter`.

    Calling it scores joint completions (a parse failure gives every role "", so the task reward decides,
    typically 0); `build_prompt(item)` is the joint prompt; `split` / `split_eval` give the role outputs;
    `wrap_metrics_callback(cb)` hands a metrics callback one sample per role. `reward_range` is the task's.
    """

    def __init__(self, adapter, formatters: Callable | Sequence[Callable] | None, reward_func: Callable,
                 num_roles: int):
        from coopflow.utils.formatters import build_formatters

        self.adapter, self.reward_func, self.num_roles = adapter, reward_func, num_roles
        self.formatters = build_formatters(formatters, num_roles)
        self._reward = CentralizedReward(RewardCaller(reward_func, num_roles), adapter, self.formatters[0])
        if hasattr(self._reward, "reward_range"):
            self.reward_range = self._reward.reward_range
        self._joint = JointFormatter(adapter, self.formatters)

    def __call__(self, completions: list[str], batch_items: list[dict] | None = None, **_) -> list[float]:
        return self._reward(list(completions), batch_items)

    def build_prompt(self, batch_item: dict) -> str:
        return self._joint(batch_item)

    def split(self, completion: str, batch_item: dict) -> list[str]:
        """The role outputs of one joint completion ("" for every role when it cannot be parsed)."""
        return split_roles(self.adapter, completion, batch_item, self.num_roles)[0]

    def split_eval(self, completions: Sequence[str], batch_items: Sequence[dict]) -> list[list[str]]:
        """[role][item] outputs of joint completions (one per item), as an eval_logger's per-agent lists."""
        per = [self.split(c, it) for c, it in zip(completions, batch_items)]
        return [[p[i] for p in per] for i in range(self.num_roles)]

    def wrap_metrics_callback(self, callback: Callable | None) -> Callable | None:
        """A metrics callback that receives one shallow copy per role of every joint sample (agent_idx = the role,
        completion = that role's output; metadata shared with the original)."""
        if callback is None:
            return None

        def wrapped(samples):
            out = []
            for s in samples:
                item = (getattr(s, "metadata", None) or {}).get("batch_item", {})
                for i, text in enumerate(self.split(s.completion, item)):
                    c = copy.copy(s)
                    c.agent_idx, c.completion = i, text
                    out.append(c)
            return callback(out)

        return wrapped
