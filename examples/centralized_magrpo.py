"""Centralized MAGRPO (CoMLRL 1.4.3's centralized multi-agent system training): ONE model writes both roles of
the story-length task in one completion, and an adapter splits that completion back into the two roles the
task reward scores. With an instruction-tuned model the default tagged adapter asks for
<agent_0>...</agent_0><agent_1>...</agent_1> sections; the random "tiny" model cannot follow that, so this
script uses a small adapter of its own: role 0 is the completion's first 12 characters, role 1 the rest, so
the joint actor must learn a total length of 36-48 characters for the 2-3x ratio.

    python examples/centralized_magrpo.py          (COOPFLOW_EXAMPLE_QUICK=1: a seconds-long smoke run)
    COOPFLOW_EXAMPLE_MODEL=smollm2-135m-instruct python examples/centralized_magrpo.py   (tagged adapter)
"""

import os

from datasets import Dataset

from coopflow.trainers.preference import TaggedCentralizedComparatorAdapter
from coopflow.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from coopflow.utils import set_reward_range

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"
MODEL = os.environ.get("COOPFLOW_EXAMPLE_MODEL", "tiny")


class FixedWidth:
    """Role 0 = the first `width` characters of the joint completion, role 1 = the rest (empty: a parse error)."""

    def __init__(self, width: int = 12):
        self.width = width

    def build_prompt(self, item, agent_prompts):
        return " | ".join(agent_prompts)

    def parse_completion(self, completion, item, num_agents):
        from coopflow.trainers.preference import CentralizedComparatorParseError

        if not completion:
            raise CentralizedComparatorParseError("empty joint completion")
        return [completion[:self.width], completion[self.width:]]


def length_ratio_reward(short, long):
    """1.0 when the second role is 2-3x as long as the first, falling off outside."""
    out = []
    for a, b in zip(short, long):
        r = len(b) / len(a) if a else 0.0
        out.append(1.0 if 2 <= r <= 3 else max(0.0, 1.0 - abs(r - 2.5) / 2.5))
    return out


set_reward_range(length_ratio_reward, minimum=0.0, maximum=1.0)

if __name__ == "__main__":
    topics = ["a robot", "the ocean", "a dragon", "the moon", "a little fox", "a tree", "the rain", "a city"]
    train = Dataset.from_dict({"prompt": topics[:4 if QUICK else 8]})
    adapter = FixedWidth() if MODEL == "tiny" else TaggedCentralizedComparatorAdapter()
    args = CentralizedMAGRPOConfig(
        num_agents=2, num_train_epochs=1 if QUICK else 2, agent_learning_rate=1e-3 if MODEL == "tiny" else 1e-5,
        num_generations=4, max_new_tokens=8 if QUICK else 48, temperature=1.0, top_p=1.0, rollout_buffer_size=1,
        eval_interval=0, eval_num_samples=4)
    trainer = CentralizedMAGRPOTrainer(
        agent_model=MODEL, num_agents=2, reward_func=length_ratio_reward, train_dataset=train, args=args,
        formatters=[lambda it: f"Write a one-line story about {it['prompt']}.",
                    lambda it: f"Write a longer story about {it['prompt']}, two to three times as long."],
        centralized_adapter=adapter, wandb_config={"project": "coopflow-examples", "name": "centralized-magrpo"})
    summary = trainer.train()
    print(f"one joint actor ({len(trainer.agents)} model, {trainer.num_roles} roles): env steps {trainer.env_step}, "
          f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; eval {summary['eval']}")
    trainer.save_model(os.environ.get("COOPFLOW_EXAMPLE_OUT", "output/centralized-magrpo"))
