"""Stage: evaluate — a single sampled path per eval item (spec §2.1.8).

Each agent generates **one** completion per eval item (one batched generate per agent), the joint
action is scored with the task reward, and the metrics are `eval/turn_1/reward_mean` and
`eval/turn_1/expected_return` (the undiscounted reward-to-go; equal to the reward for one turn).
"""

from collections.abc import Callable

from stages.generate_rollouts import SamplingConfig, generate_rollouts
from stages.models import Policies
from stages.rewards import RewardCaller
from stages.score_rewards import score_rewards


def evaluate(policies: Policies, items: list[dict], formatters: list[Callable[[dict], str]],
             sampling: SamplingConfig, caller: RewardCaller, processor: Callable[[float], float],
             seed: int) -> tuple[list[dict], dict[str, float]]:
    """Eval rows (schema `eval`) and metrics for the given items."""
    if not items:
        return [], {}
    one = SamplingConfig(1, sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k)
    prompts = [[f(it) for it in items] for f in formatters]
    ids = [it["_item_id"] for it in items]
    rollouts = generate_rollouts(policies, prompts, ids, one, seed=seed, step=-1)
    scores = score_rewards(rollouts, {it["_item_id"]: it for it in items}, caller, processor, "aligned", 0)
    reward = {s["item_id"]: s["reward"] for s in scores}
    rows = [{"item_id": r["item_id"], "turn": r["turn"], "agent": r["agent"], "prompt": r["prompt"],
             "completion_text": r["completion_text"], "reward": reward[r["item_id"]],
             "return": reward[r["item_id"]]} for r in rollouts]
    mean = sum(reward.values()) / len(reward)
    return rows, {"eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean}
