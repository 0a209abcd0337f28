"""Continue training (the seed's resume tutorial): train one epoch, then continue the same run for two
more epochs. The continuation reuses the stored first epoch (nothing is recomputed), restores the
optimizer, RNG and data position, and logs into the same MLflow run with env_step continuing.

    python examples/resume_training.py
"""

import os

from datasets import Dataset

from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from coopflow.stages.score.rewards import length_ratio

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"


def make_trainer(epochs):
    train = Dataset.from_dict({"prompt": [f"write a story about {t}" for t in ("a fox", "the moon", "rain", "a tree")]})
    args = MAGRPOConfig(num_turns=1, num_train_epochs=epochs, agent_learning_rate=1e-3, num_generations=2,
                        max_new_tokens=8 if QUICK else 32, temperature=1.0, top_p=1.0, rollout_buffer_size=2,
                        eval_interval=0, eval_num_samples=2)
    return MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=length_ratio, train_dataset=train, args=args)


if __name__ == "__main__":
    first = make_trainer(1).train()
    print(f"epoch 1: {first['env_steps']} env steps, MLflow run {first['mlflow_run_id']}")
    more = make_trainer(3).train(continue_run=first["mlflow_run_id"])  # or wandb_config={"id": ..., "resume": "must"}
    print(f"epochs 1-3: {more['env_steps']} env steps in the same MLflow run {more['mlflow_run_id']}")
    assert more["mlflow_run_id"] == first["mlflow_run_id"]
