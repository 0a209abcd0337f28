"""Run a peer harness (CoMLRL 1.4.3, in the peer venv) in a chosen configuration, and report the work it did.

    python bench/peer_run.py [--mp] [--seed S] HARNESS.py ARGS...

- `--mp`: the peer's own parallel mode, `parallel_training="mp"` with one device name per agent (`cpu:0`,
  `cpu:1`; torch maps both to the CPU): CoMLRL then runs each agent's generate and update on its own thread,
  both at once (with one device for all agents it runs them one after another). IAC's critics get the agents'
  devices, MAAC's one shared critic `cpu:0`.
- `--seed S`: the harness seeds torch with 0; every `torch.manual_seed` call is redirected to S.
- Torch threads are the harness's own setting (its THREADS environment variable or argument).

Every `generate` call is recorded (the distinct prompts' lengths, and per returned row its prompt length and how
many tokens it sampled, EOS included), and printed at exit as one line `PEER_WORK {"calls": [...]}` for
bench/flops.py. The harness runs unchanged otherwise.
"""

import atexit
import json
import os
import runpy
import sys
import threading


def main() -> None:
    args = sys.argv[1:]
    mp, seed = False, None
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--mp":
            mp = True
        elif flag == "--seed":
            seed = int(args.pop(0))
        else:
            raise SystemExit(f"peer_run.py: unknown option {flag}")
    if not args:
        raise SystemExit("usage: peer_run.py [--mp] [--seed S] HARNESS.py ARGS...")
    if mp:
        _parallel_agents()
    if seed is not None:
        import torch

        set_seed = torch.manual_seed
        torch.manual_seed = lambda _s: set_seed(seed)
    _record_generate()
    sys.argv = args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))  # as `python HARNESS.py` would: its helpers import
    runpy.run_path(args[0], run_name="__main__")


def _parallel_agents() -> None:
    """Default every trainer config to parallel_training='mp' on per-agent CPU device names."""
    from comlrl.trainers.actor_critic import iac, maac
    from comlrl.trainers.reinforce import magrpo

    for cls in (magrpo.MAGRPOConfig, iac.IACConfig, maac.MAACConfig):
        original = cls.__post_init__

        def post_init(self, _original=original, _cls=cls):
            if str(getattr(self, "parallel_training", "none")).lower() in ("none", "null"):
                n = int(getattr(self, "num_agents", 2) or 2)
                self.parallel_training = "mp"
                self.agent_devices = [f"cpu:{i}" for i in range(n)]
                if hasattr(self, "critic_devices"):  # IAC: a critic per agent; MAAC: one shared critic
                    self.critic_devices = list(self.agent_devices) if _cls is iac.IACConfig else ["cpu:0"]
            _original(self)

        cls.__post_init__ = post_init


_CALLS: list[dict] = []
_LOCK = threading.Lock()


def _record_generate() -> None:
    from transformers.generation.utils import GenerationMixin

    generate = GenerationMixin.generate

    def recorded(self, *a, **kw):
        out = generate(self, *a, **kw)
        try:
            _note(self, kw.get("input_ids", a[0] if a else None), kw.get("attention_mask"), out, kw)
        except Exception as err:  # counting must never change the run
            print(f"peer_run: could not count a generate call: {err}", file=sys.stderr)
        return out

    GenerationMixin.generate = recorded
    atexit.register(lambda: print("PEER_WORK " + json.dumps({"calls": _CALLS}), flush=True))


def _note(model, input_ids, attention_mask, out, kw) -> None:
    seqs = getattr(out, "sequences", out)
    if input_ids is None or seqs is None:
        return
    n_in, width = input_ids.shape
    mask = attention_mask if attention_mask is not None else input_ids.new_ones(input_ids.shape)
    lengths = mask.sum(-1).tolist()
    distinct = {}
    for row, n in zip(input_ids.tolist(), lengths):  # equal prompts are equal padded rows within a call
        distinct[tuple(row)] = n
    eos = kw.get("eos_token_id", model.generation_config.eos_token_id)
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    per = max(1, seqs.shape[0] // n_in)
    rows = []
    for i, new in enumerate(seqs[:, width:].tolist()):
        c = next((j + 1 for j, tok in enumerate(new) if tok in eos), len(new))
        rows.append([lengths[i // per], c])
    with _LOCK:
        _CALLS.append({"distinct": list(distinct.values()), "rows": rows})


if __name__ == "__main__":
    main()
