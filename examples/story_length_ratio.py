"""Two agents write about the same topic; the team is rewarded when agent 2's story is 2-3x as long as
agent 1's (the seed's first tutorial, MAGRPO). Swap `agent_model` for a Hugging Face id or a local
directory to train a real model; "tiny" is a small model coopflow builds locally.

    python examples/story_length_ratio.py          (COOPFLOW_EXAMPLE_QUICK=1: a seconds-long smoke run)
"""

import math
import os

from datasets import Dataset

from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"


def length_ratio_reward(completions1, completions2):
    """1.0 when len(agent 2) / len(agent 1) is in [2, 3], else exp(-distance to that interval)."""
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        if not c1:
            rewards.append(0.0)
            continue
        r = len(c2) / len(c1)
        rewards.append(1.0 if 2 <= r <= 3 else math.exp(-(2 - r if r < 2 else r - 3)))
    return rewards


if __name__ == "__main__":
    topics = ["a robot", "the ocean", "a dragon", "a city in the clouds", "the moon", "a little fox", "a tree",
              "the rain"]
    train = Dataset.from_dict({"prompt": [f"write a story about {t}" for t in topics[:4 if QUICK else 8]]})
    args = MAGRPOConfig(
        num_turns=1, num_train_epochs=1 if QUICK else 2, agent_learning_rate=1e-3, num_generations=4,
        max_new_tokens=8 if QUICK else 32, temperature=1.0, top_p=1.0, top_k=50, rollout_buffer_size=1,
        eval_interval=0, eval_num_samples=4)
    trainer = MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=length_ratio_reward, train_dataset=train,
                            args=args, wandb_config={"project": "coopflow-examples", "name": "story-length-ratio"})
    summary = trainer.train()
    print(f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; eval {summary['eval']}")
    trainer.save_model(os.environ.get("COOPFLOW_EXAMPLE_OUT", "output/story-length-ratio"))
