"""GPU check (issue 23): correctness and speed of coopflow's GPU path on one machine, in one short script.

    bash bench/gpu_check.sh            # on a machine with a CUDA GPU (under 8 minutes on one H100/H200)
    bash bench/gpu_check.sh --dry-run  # the same steps on the CPU with a tiny model (syntax and plumbing)

Steps (each prints one line; a failed step prints FAIL and the script continues):
1. environment: torch / transformers versions, device name, bf16 support;
2. a random-initialised Qwen2-architecture model of ~0.5B parameters (hidden 1024, 28 layers, 16 heads, 2 KV
   heads, MLP 4864, vocabulary padded to 32768) with a locally trained tokenizer — no weights are downloaded;
3. correctness: coopflow's KV-cache decode loop draws the same tokens as `model.generate` for the same seed
   (float32, on the device, 2 samples per prompt), in every step mode: auto (= CUDA-graph replay of the
   static-shape step on a GPU), dynamic (growing cache), static, cuda_graph;
4. generation tokens/s in bf16 with SDPA: `model.generate` vs the decode loop (auto: CUDA graphs on a GPU) and
   the loop without graphs (dynamic), 32 sequences x 128 tokens;
5. training env_steps/s: two agents, MAGRPO, story-length reward, K=4, 64 tokens, bf16 weights on the device,
   in-process and with `parallel_training: mp` (one GPU per agent when there are two, else both on GPU 0);
6. the peer, CoMLRL 1.4.3, on the same model and workload when it is importable (or installable offline from
   wheels in bench/.wheels: `pip download --no-deps -d bench/.wheels comlrl==1.4.3 wandb openai` beforehand).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

RESULTS: dict = {}


def step(name: str):
    """Decorator: run a step, print its line, keep its result; a failure prints FAIL and the script goes on."""
    def wrap(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **kw)
                RESULTS[name] = out
                print(f"[{time.perf_counter() - t0:6.1f} s] {name}: {out}", flush=True)
                return out
            except Exception as err:  # noqa: BLE001 (a check script reports and continues)
                RESULTS[name] = {"error": f"{type(err).__name__}: {err}"}
                print(f"[{time.perf_counter() - t0:6.1f} s] {name}: FAIL {type(err).__name__}: {err}", flush=True)
                return None
        return run
    return wrap


@step("environment")
def environment(device: str) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device}
    if device.startswith("cuda"):
        info.update(name=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                    bf16=torch.cuda.is_bf16_supported())
    return info


@step("model")
def build_model(out: Path, dry: bool) -> dict:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from coopflow.stages.agents.models import build_tiny_model

    build_tiny_model(out / "tok", vocab_size=384)  # (its tokenizer; the model is replaced below)
    tok = AutoTokenizer.from_pretrained(out / "tok")
    dims = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128) if dry else
            dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=2,
                 intermediate_size=4864))
    cfg = Qwen2Config(vocab_size=max(len(tok), 512 if dry else 32768), max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                      tie_word_embeddings=True, **dims)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return {"params_M": round(sum(p.numel() for p in model.parameters()) / 1e6), "dir": str(out / "model")}


def _prompts(tok, rows: int):
    words = ["once upon a time", "the ocean at night", "a little fox", "the moon and the star"]
    return tok([words[i % len(words)] for i in range(rows)], return_tensors="pt", padding=True)


@step("correctness (fp32: decode loop == generate)")
def correctness(model_dir: Path, device: str) -> dict:
    from transformers import GenerationConfig

    from coopflow.stages.agents import decode as FD
    from coopflow.stages.agents.models import load_agent

    model, tok = load_agent(model_dir, "float32", "sdpa", device)
    enc = _prompts(tok, 4)
    ids = enc.input_ids.repeat_interleave(2, 0).to(device)
    am = enc.attention_mask.repeat_interleave(2, 0).to(device)
    gc = GenerationConfig(do_sample=True, max_new_tokens=24, temperature=0.8, top_p=0.95, top_k=50,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(3)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids, attention_mask=am, generation_config=gc)[:, ids.shape[1]:]
    out, ok = {}, True
    # every step mode the device has (auto = CUDA-graph replay on a GPU), K=2 samples per prompt (shared prefill)
    modes = ["auto", "dynamic", "static"] + (["cuda_graph"] if device.startswith("cuda") else [])
    for mode in modes:
        torch.manual_seed(3)
        mine = FD.sample(model, ids, am, 24, 0.8, 50, 0.95, tok.eos_token_id, tok.pad_token_id, step_mode=mode)
        same = ref.shape == mine.shape and bool(torch.equal(ref, mine))
        agree = float((ref[:, :mine.shape[1]] == mine[:, :ref.shape[1]]).float().mean())
        out[f"{mode}_same_tokens"], out[f"{mode}_token_agreement"] = same, round(agree, 4)
        ok = ok and same
    out["verdict"] = "PASS" if ok else "FAIL"
    return out


@step("generation tokens/s (bf16, SDPA)")
def generation_speed(model_dir: Path, device: str, rows: int, tokens: int) -> dict:
    from transformers import GenerationConfig

    from coopflow.stages.agents import decode as FD
    from coopflow.stages.agents.models import load_agent

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model, tok = load_agent(model_dir, dtype, "sdpa", device)
    enc = _prompts(tok, rows)
    ids, am = enc.input_ids.to(device), enc.attention_mask.to(device)
    gc = GenerationConfig(do_sample=True, max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0, top_k=50,
                          pad_token_id=tok.pad_token_id, eos_token_id=None, bos_token_id=None)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def hf():
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=am, generation_config=gc)

    def loop(mode):
        return lambda: FD.sample(model, ids, am, tokens, 1.0, 50, 1.0, None, tok.pad_token_id, step_mode=mode)

    out = {}
    runs = [("generate", hf), ("decode_loop", loop("auto")), ("decode_loop_dynamic", loop("dynamic"))]
    for name, fn in runs:
        fn()  # warm-up
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out[f"{name}_tokens_per_s"] = round(rows * tokens / (time.perf_counter() - t0), 1)
    out["ratio"] = round(out["decode_loop_tokens_per_s"] / out["generate_tokens_per_s"], 2)
    return out


def _train_config(model_dir: Path, data: Path, device: str, items: int, tokens: int, mp: bool) -> dict:
    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    trainer = {"num_train_epochs": 1, "agent_learning_rate": 1e-5, "num_generations": 4, "max_new_tokens": tokens,
               "temperature": 1.0, "top_p": 1.0, "top_k": 50, "num_turns": 1, "rollout_buffer_size": 2,
               "eval_interval": 0, "eval_num_samples": 1}
    if mp:
        trainer.update(parallel_training="mp",
                       agent_devices=["cuda:0", "cuda:1"] if gpus >= 2 else [device, device])
    return {"algorithm": "magrpo",
            "agents": {"agent_model": str(model_dir), "num_agents": 2, "device": device,
                       "dtype": "bfloat16" if device.startswith("cuda") else "float32"},
            "taskset": {"name": "story-length-ratio", "num_items": items, "num_eval_items": 1},
            "reward": {"name": "length_ratio"}, "trainer": trainer, "eval_before": False,
            "data_dir": str(data), "seed": 0, "tracking": {"enabled": False}}


CHILD = """
import json, sys
from coopflow.schemas.config import validate_config
from coopflow.flows.driver import run_inline
s = run_inline(validate_config(json.load(open(sys.argv[1]))))
print("RESULT " + json.dumps({k: s[k] for k in ("env_steps", "train_seconds", "env_steps_per_s", "reward_first",
                                                 "reward_last", "load_seconds", "seconds")}))
"""


def _child(cmd: list[str], env: dict, timeout: float) -> dict:
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-800:]}")


@step("training env_steps/s (coopflow, 2 agents)")
def training(model_dir: Path, tmp: Path, device: str, items: int, tokens: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = {}
    for mode in ("in-process", "mp"):
        cfg = tmp / f"train-{mode}.json"
        cfg.write_text(json.dumps(_train_config(model_dir, tmp / f"data-{mode}", device, items, tokens, mode == "mp")))
        r = _child([sys.executable, "-c", CHILD, str(cfg)], env, 240)
        out[mode] = {"env_steps_per_s": round(r["env_steps_per_s"], 3), "seconds": r["seconds"],
                     "reward": [round(r["reward_first"], 3), round(r["reward_last"], 3)]}
        shutil.rmtree(tmp / f"data-{mode}", ignore_errors=True)
    return out


PEER = """
import json, sys, time, os
os.environ["WANDB_MODE"] = "disabled"
import torch
from datasets import Dataset
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
sys.path.insert(0, sys.argv[4])
sys.path.insert(0, sys.argv[5])
from coopflow.stages.score.rewards import length_ratio  # (standard library only: the peer's python imports it too)
seen = []
def reward(c1, c2):
    out = length_ratio(c1, c2); seen.extend(out); return out
items = json.loads(sys.argv[4])
cfg = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=1e-5, num_agents=2, num_generations=4,
                   max_new_tokens=int(sys.argv[3]), temperature=1.0, top_p=1.0, top_k=None, num_turns=1,
                   eval_interval=0, rollout_buffer_size=2, logging_steps=1000)
tr = MAGRPOTrainer(agent_model=sys.argv[1], num_agents=2, reward_func=reward,
                   train_dataset=Dataset.from_list(items), args=cfg)
tr.verbose = False
t0 = time.time(); tr.train(); dt = time.time() - t0
print("RESULT " + json.dumps({"env_steps_per_s": len(seen) / dt, "train_seconds": dt,
                              "device": str(next(tr.agents[0].parameters()).device)}))
"""


def _peer_python(tmp: Path, given: str | None) -> str | None:
    """A python that imports comlrl: `given`, this one, or a venv over this one with the wheels of bench/.wheels."""
    if given:
        return given
    if subprocess.run([sys.executable, "-c", "import comlrl"], capture_output=True).returncode == 0:
        return sys.executable
    wheels = REPO / "bench" / ".wheels"
    if not any(wheels.glob("comlrl-*.whl")):
        return None
    venv = tmp / "peer-venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels.glob("*.whl"))],
                   check=True, timeout=120)
    return py


@step("peer (CoMLRL 1.4.3) env_steps/s")
def peer(model_dir: Path, tmp: Path, items: int, tokens: int, given: str | None) -> dict:
    py = _peer_python(tmp, given)
    if py is None:
        return {"skipped": "comlrl is not importable and bench/.wheels holds no comlrl wheel"}
    from coopflow.stages.tasks.taskset import _builtin

    prompts = [{"prompt": it["prompt"]} for it in _builtin("story-length-ratio")["train"][:items]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = _child([py, "-c", PEER, str(model_dir), str(items), str(tokens), json.dumps(prompts), str(REPO)], env, 300)
    ours = (RESULTS.get("training env_steps/s (coopflow, 2 agents)") or {}).get("in-process", {}).get("env_steps_per_s")
    if ours:
        r["coopflow_in_process_ratio"] = round(ours / r["env_steps_per_s"], 2)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="run every step on the CPU with a tiny model")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--peer-python", default=None, help="a python with comlrl==1.4.3 (e.g. .bench/peer-venv/bin/python)")
    a = ap.parse_args()
    if not a.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    device = "cpu" if a.dry_run else "cuda"
    rows, tokens, items, train_tokens = (4, 8, 2, 8) if a.dry_run else (32, 128, 8, 64)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        environment(device)
        built = build_model(tmp, a.dry_run)
        if built is None:
            return 1
        model_dir = Path(built["dir"])
        correctness(model_dir, device)
        generation_speed(model_dir, device, rows, tokens)
        training(model_dir, tmp, device, items, train_tokens)
        peer(model_dir, tmp, items, train_tokens, a.peer_python)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        Path(a.out).write_text(json.dumps(RESULTS, indent=1))
    failed = [k for k, v in RESULTS.items() if isinstance(v, dict) and ("error" in v or v.get("verdict") == "FAIL")]
    print(f"gpu_check: {len(RESULTS) - len(failed)} step(s) ok, {len(failed)} failed {failed or ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
