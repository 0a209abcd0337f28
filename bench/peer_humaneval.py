"""Peer side of bench/bench_humaneval.py: CoMLRL 1.4.3's MAGRPOTrainer on the two-agent HumanEval task.

Run in the peer venv with PYTHONPATH=<repo> (for the shared reward: coopflow's sandboxed HumanEval reward
and role prompts, loaded from their file so nothing else of coopflow is imported):

    python bench/peer_humaneval.py MODEL_DIR ITEMS_JSON K TOKENS RBS

Prints one JSON line: env_steps (joint answers scored), train seconds, env_steps_per_s, reward first/last.
"""
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

os.environ["WANDB_MODE"] = "disabled"
REPO = Path(__file__).resolve().parent.parent

import torch  # noqa: E402
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

spec = importlib.util.spec_from_file_location("coding_env", REPO / "stages" / "tasks" / "envs" / "coding.py")
coding = importlib.util.module_from_spec(spec)
spec.loader.exec_module(coding)

model_dir, items_file = sys.argv[1], sys.argv[2]
k, tokens, rbs = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
items = json.loads(Path(items_file).read_text())
tok = AutoTokenizer.from_pretrained(model_dir)


def chat(text: str) -> str:  # what coopflow's formatter with chat_template: true builds
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


seen: list[float] = []


def reward(*completions, batch_items=None):  # varargs: CoMLRL counts defaulted positionals as completions
    out = coding.humaneval_reward(*completions, batch_items=batch_items)
    seen.extend(out)
    return out


cfg = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=1e-5, num_agents=2, num_generations=k, max_new_tokens=tokens,
                   temperature=0.8, top_p=0.95, top_k=50, num_turns=1, eval_interval=0, rollout_buffer_size=rbs,
                   logging_steps=1000)
tr = MAGRPOTrainer(agent_model=model_dir, num_agents=2, reward_func=reward, train_dataset=Dataset.from_list(items),
                   formatters=[lambda it: chat(coding.helper_prompt(it)), lambda it: chat(coding.main_prompt(it))],
                   args=cfg)
tr.verbose = False
t0 = time.time()
tr.train()
dt = time.time() - t0
n = max(1, len(seen) // 5)
print(json.dumps({"peer": "comlrl-1.4.3", "env_steps": len(seen), "train_seconds": dt,
                  "env_steps_per_s": len(seen) / dt, "reward_first": sum(seen[:n]) / n,
                  "reward_last": sum(seen[-n:]) / n}))
