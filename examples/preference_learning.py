"""Preference learning (the seed's MADPO / MARLHF tutorials): sample joint answers, turn task-reward
differences into preference pairs, then either train with multi-agent DPO (MADPO) or fit a joint reward
model and run MAGRPO on it (MARLHF). Evaluation always uses the task reward.

    python examples/preference_learning.py
"""

import os

from datasets import Dataset

from coopflow.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from coopflow.stages.score.rewards import length_ratio

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"

if __name__ == "__main__":
    topics = ["a robot", "the ocean", "a dragon", "the moon", "a little fox", "a tree", "the rain", "a city"]
    train = Dataset.from_dict({"prompt": [f"write a story about {t}" for t in topics[:4 if QUICK else 8]]})
    common = dict(agent_learning_rate=1e-3, max_new_tokens=8 if QUICK else 32, temperature=1.0, top_p=1.0,
                  preference_num_candidates=4 if QUICK else 16, preference_pairs_per_sample=4 if QUICK else 16,
                  eval_interval=0, eval_num_samples=4)
    madpo = MADPOTrainer(agent_model="tiny", num_agents=2, reward_func=length_ratio, train_dataset=train,
                         args=MADPOConfig(num_train_epochs=1 if QUICK else 4, train_batch_size=8, dpo_beta=0.1,
                                          **common))
    print("MADPO eval:", madpo.train()["eval"])
    marlhf = MARLHFTrainer(agent_model="tiny", num_agents=2, reward_func=length_ratio, train_dataset=train,
                           args=MARLHFConfig(num_train_epochs=1, rl_algorithm="magrpo", num_generations=2,
                                             rollout_buffer_size=2, reward_learning_rate=1e-3,
                                             reward_num_train_epochs=1 if QUICK else 4, reward_train_batch_size=8,
                                             **common))
    print("MARLHF eval (task reward):", marlhf.train()["eval"])
