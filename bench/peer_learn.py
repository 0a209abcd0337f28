"""Peer side of bench/bench_learning.py: CoMLRL 1.4.3's MAGRPOTrainer trains on prompts rendered by coopflow, then
saves its agents for coopflow's evaluator.

Run in the peer venv (through bench/peer_run.py for its parallel mode):

    python bench/peer_learn.py SPEC_JSON OUT_DIR

SPEC_JSON: {"model": dir, "seed": int, "threads": int, "items": [{"prompts": [agent 0's, agent 1's]}, ...],
"reward": "module:function", "trainer": {num_generations, max_new_tokens, temperature, top_p, top_k,
rollout_buffer_size, agent_learning_rate, num_train_epochs}}. The prompts are exactly what coopflow's formatters
build (chat template and system prompts included), so both sides train on the same text. Prints one line
`BENCH_RESULT {...}`: env_steps, train_seconds (trainer.train() only, models loaded before), reward first/last fifth.
"""
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ["WANDB_MODE"] = "disabled"
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import coopflow  # noqa: E402  (not installed in the peer venv: its parts are found where the wheel maps them from)

coopflow.__path__.append(str(REPO))

import torch  # noqa: E402
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(sys.argv[2])
torch.manual_seed(spec["seed"])
torch.set_num_threads(spec["threads"])
module, name = spec["reward"].split(":")
score = getattr(importlib.import_module(module), name)
seen: list[float] = []


def reward(c1, c2):
    r = score(c1, c2)
    seen.extend(r)
    return r


t = spec["trainer"]
cfg = MAGRPOConfig(num_train_epochs=t["num_train_epochs"], agent_learning_rate=t["agent_learning_rate"], num_agents=2,
                   num_generations=t["num_generations"], max_new_tokens=t["max_new_tokens"],
                   temperature=t["temperature"], top_p=t["top_p"], top_k=t["top_k"], num_turns=1, eval_interval=0,
                   rollout_buffer_size=t["rollout_buffer_size"], logging_steps=1000)
items = [{"p0": it["prompts"][0], "p1": it["prompts"][1]} for it in spec["items"]]
tr = MAGRPOTrainer(agent_model=spec["model"], num_agents=2, reward_func=reward, train_dataset=Dataset.from_list(items),
                   formatters=[lambda it: it["p0"], lambda it: it["p1"]], args=cfg)
tr.verbose = False
t0 = time.time()
tr.train()
dt = time.time() - t0
tok = AutoTokenizer.from_pretrained(spec["model"])
for i, agent in enumerate(tr.agents):
    agent.save_pretrained(out / f"agent_{i}")
    tok.save_pretrained(out / f"agent_{i}")
n = max(1, len(seen) // 5)
print("BENCH_RESULT " + json.dumps({"side": "comlrl-1.4.3", "env_steps": len(seen), "train_seconds": dt,
                                    "reward_first": sum(seen[:n]) / n, "reward_last": sum(seen[-n:]) / n}))
