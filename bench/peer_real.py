"""Peer side of bench/bench_real.py: CoMLRL 1.4.3's MAGRPOTrainer on a real model, with a time split.

Run in the peer venv (the rewards and role prompts come from coopflow's `stages.score.rewards` and coding
module, which import only the standard library and coopflow's sandbox):

    python bench/peer_real.py TASK MODEL_DIR ITEMS_JSON K TOKENS RBS THREADS

TASK: humaneval (two coding roles, the sandboxed test reward) | story (both agents get the story prompt,
reward: agent 2 writes 2-3x agent 1's characters). Prints one JSON line: env_steps, train seconds,
env_steps_per_s, reward first/last and where the time went (exclusive seconds): generate (HF generate),
loss_forward (model forwards inside the loss), loss_other (rest of the loss: per-token log-softmax loop,
advantages), backward, optimizer, reward, other.
"""
import functools
import json
import os
import sys
import time
from pathlib import Path

os.environ["WANDB_MODE"] = "disabled"
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # coopflow's rewards and prompts (standard library and coopflow's sandbox only)
import coopflow  # noqa: E402  (not installed in the peer venv: its parts are found where the wheel maps them from)

coopflow.__path__.append(str(REPO))

import torch  # noqa: E402
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from exclusive_timers import T, timed  # noqa: E402  (bench/, this script's directory)
from coopflow.stages.score.rewards import length_ratio  # noqa: E402


task, model_dir, items_file = sys.argv[1], sys.argv[2], sys.argv[3]
k, tokens, rbs, threads = (int(x) for x in sys.argv[4:8])
torch.manual_seed(0)
torch.set_num_threads(threads)
items = json.loads(Path(items_file).read_text())
tok = AutoTokenizer.from_pretrained(model_dir)

def chat(text: str) -> str:  # what coopflow's formatter with chat_template: true builds
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


seen: list[float] = []
if task == "humaneval":
    from coopflow.stages.tasks.envs import coding

    @functools.partial(timed, "reward")
    def reward(*completions, batch_items=None):  # varargs: CoMLRL counts defaulted positionals as completions
        out = coding.humaneval_reward(*completions, batch_items=batch_items)
        seen.extend(out)
        return out

    formatters = [lambda it: chat(coding.helper_prompt(it)), lambda it: chat(coding.main_prompt(it))]
else:
    @functools.partial(timed, "reward")
    def reward(c1, c2):
        out = length_ratio(c1, c2)
        seen.extend(out)
        return out

    formatters = [lambda it: chat(it["prompt"])] * 2

cfg = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=1e-5, num_agents=2, num_generations=k, max_new_tokens=tokens,
                   temperature=0.8, top_p=0.95, top_k=50, num_turns=1, eval_interval=0, rollout_buffer_size=rbs,
                   logging_steps=1000)
tr = MAGRPOTrainer(agent_model=model_dir, num_agents=2, reward_func=reward, train_dataset=Dataset.from_list(items),
                   formatters=formatters, args=cfg)
tr.verbose = False
_in_loss = [False]
_orig_loss = MAGRPOTrainer._compute_loss_with_gradients


def _loss(self, *a, **kw):
    _in_loss[0] = True
    try:
        return _orig_loss(self, *a, **kw)
    finally:
        _in_loss[0] = False


MAGRPOTrainer._compute_loss_with_gradients = timed("loss_other", _loss)
torch.Tensor.backward = timed("backward", torch.Tensor.backward)
for agent in tr.agents:
    agent.generate = timed("generate", agent.generate)
    fwd = agent.forward

    def fwd_w(*a, _f=fwd, **kw):
        return timed("loss_forward", _f)(*a, **kw) if _in_loss[0] else _f(*a, **kw)
    agent.forward = fwd_w
for opt in tr.optimizers:
    opt.step = timed("optimizer", opt.step)
    opt.zero_grad = timed("optimizer", opt.zero_grad)
t0 = time.time()
tr.train()
dt = time.time() - t0
split = {c: round(T.get(c, 0.0), 2) for c in ("generate", "loss_forward", "loss_other", "backward", "optimizer", "reward")}
split["other"] = round(dt - sum(split.values()), 2)
n = max(1, len(seen) // 5)
print("BENCH_RESULT " + json.dumps({"side": "comlrl-1.4.3", "env_steps": len(seen), "train_seconds": dt,
                                    "env_steps_per_s": len(seen) / dt, "reward_first": sum(seen[:n]) / n,
                                    "reward_last": sum(seen[-n:]) / n, "split": split}))
