"""Benchmark: peak memory of N agents as LoRA adapters on one shared base vs N full copies.

    python bench/bench_lora_memory.py [--model smollm2-135m-instruct | tiny | DIR] [--agents 2 4] [--r 8]

Each configuration runs in a fresh process: load the N agents (full copies: `load_policies`, one model each;
LoRA: `load_lora_policies`, one base + N adapters), then one training step per agent (a forward and backward
over a 4 x 64-token batch and an AdamW step, so the optimizer state exists), and report the process's peak RSS
(`ru_maxrss`), its trainable parameters and the bytes of one checkpoint. Needs the `lora` and `models` extras.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = r"""
import json, resource, sys, tempfile
from pathlib import Path
import torch
torch.set_num_threads(1)
from coopflow.schemas.config import LoraSettings
from coopflow.stages.agents.models import load_policies, save_checkpoint
from coopflow.stages.agents.lora import load_lora_policies, lora_specs
from coopflow.stages.agents.spec import specs_for
src, n, mode, r = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
specs = specs_for([src] * n, 1e-4, references=[src] * n)
if mode == "lora":
    pol = load_lora_policies(lora_specs(specs, src, LoraSettings(r=r), 0))
else:
    pol = load_policies(specs)
trainable = 0
for a in pol.agents:
    if a.activate: a.activate()
    ids = torch.randint(0, a.tokenizer.vocab_size, (4, 64))
    a.model.train()
    loss = a.model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt = a.ensure_optimizer()
    opt.step(); opt.zero_grad(set_to_none=True)
    trainable += sum(p.numel() for g in opt.param_groups for p in g["params"])
out = Path(tempfile.mkdtemp())
try:
    save_checkpoint(pol, out, {})
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
finally:
    import shutil
    shutil.rmtree(out, ignore_errors=True)  # (a full-copy checkpoint of 4 real agents is several GB)
print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "trainable": trainable, "checkpoint_mb": size / 2**20}))
"""


def model_dir(name: str) -> str:
    if Path(name).is_dir():
        return str(Path(name).resolve())
    if name == "tiny":
        from coopflow.stages.agents.models import build_tiny_model

        return str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    from coopflow.stages.agents import catalog

    d = REPO / ".bench" / "models" / name
    if not (d / "config.json").is_file():
        catalog.install_to(name, d)
    return str(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--agents", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--r", type=int, default=8)
    args = ap.parse_args(argv)
    src = model_dir(args.model)
    print(f"{args.model}: peak RSS after one AdamW step per agent (with a KL reference), one checkpoint's size")
    print(f"{'agents':>6} {'mode':>6} {'peak RSS MB':>12} {'trainable params':>17} {'checkpoint MB':>14}")
    for n in args.agents:
        res = {}
        for mode in ("full", "lora"):
            out = subprocess.run([sys.executable, "-c", CHILD, src, str(n), mode, str(args.r)], cwd=REPO,
                                 capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                                                      "OMP_NUM_THREADS": "1",
                                                                      "HF_HUB_OFFLINE": "1"})
            if out.returncode != 0:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
            r = res[mode]
            print(f"{n:>6} {mode:>6} {r['peak_rss_mb']:>12.0f} {r['trainable']:>17,} {r['checkpoint_mb']:>14.1f}")
        print(f"{'':>6} {'ratio':>6} {res['full']['peak_rss_mb'] / res['lora']['peak_rss_mb']:>11.2f}x "
              f"{'':>17} {res['full']['checkpoint_mb'] / res['lora']['checkpoint_mb']:>13.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
