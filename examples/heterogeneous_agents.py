"""Heterogeneous agents (the seed's tutorial): two different models, each with its own tokenizer and
prompt formatter. Here two small models with different widths and vocabularies are built locally;
with real models pass e.g. agents=["Qwen/Qwen2.5-0.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"].

    python examples/heterogeneous_agents.py
"""

import os
import tempfile

from datasets import Dataset

from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from coopflow.stages.agents.models import build_tiny_model  # the same builder as `coopflow tiny-model DIR`
from coopflow.stages.score.rewards import length_ratio

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"

if __name__ == "__main__":
    root = tempfile.mkdtemp(prefix="coopflow-hetero-")
    writer = str(build_tiny_model(f"{root}/writer", hidden_size=64, num_layers=2, vocab_size=384))
    editor = str(build_tiny_model(f"{root}/editor", hidden_size=48, num_layers=1, vocab_size=320, seed=1))
    train = Dataset.from_dict({"topic": ["a fox", "the moon", "rain", "a tree"]})
    formatters = [lambda item: f"Write a short story about {item['topic']}.",
                  lambda item: f"Write a long story about {item['topic']}, at least twice as long."]
    args = MAGRPOConfig(num_turns=1, num_train_epochs=1, agent_learning_rate=1e-3, num_generations=2,
                        max_new_tokens=8 if QUICK else 32, temperature=1.0, top_p=1.0, rollout_buffer_size=2,
                        eval_interval=0, eval_num_samples=2)
    trainer = MAGRPOTrainer(agents=[writer, editor], reward_func=length_ratio, formatters=formatters,
                            train_dataset=train, args=args)
    print("vocabularies:", [len(t) for t in trainer.tokenizers])
    print("eval:", trainer.train()["eval"])
