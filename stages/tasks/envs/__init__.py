"""Task environments: each a taskset source, per-role formatters, a shared reward with a `reward_range`,
evaluation hooks and (optionally) a multi-turn transition, named from configs by import path.

- `coding` (HumanEval): a helper and a main agent write a program together; sandboxed tests score it.
- `writing` (TL;DR): a short and a long summary of the same post; a dual-length reward.
- `arxiv` (writing): two parts of a paper's introduction from its abstract; the gated four-level reward.
- `tooluse` (BFCL): a planner names the functions to call, an executor writes the calls; AST matching.
- `travel` (BFCL multi-turn): planner + executor call a travel-booking simulator turn by turn.
- `math_gsm8k` (GSM8K): a solver answers, a verifier checks by solving another way; exact final number.
- `completion` (HumanEval pairs, ClassEval-style files): each agent completes its own stubs of one module.
- `expert` (coding, multi-turn): `ExpertEdits`, an external model's suggested edits as the next prompts.

`TASKSETS` maps the built-in taskset names the environments add to (source digest, loader);
`PREFIXES` maps name prefixes (`mbpp:`, `coophumaneval:`, `arxiv:`, `gsm8k:` + a file or HF id;
`classeval:` + a file; `bfcl:` + categories) to a function of the rest returning the same.
"""

import hashlib
import json

from coopflow.artifacts import sha256_file
from coopflow.stages.tasks.envs import arxiv, coding, completion, math_gsm8k, tooluse, travel, writing

TASKSETS = {
    "humaneval": (lambda: {"file_sha256": sha256_file(coding.humaneval_file())}, coding.humaneval_splits),
    "tldr-mini": (lambda: {"posts_sha256": _digest(writing.POSTS)}, writing.tldr_mini_splits),
    "arxiv-mini": (lambda: {"abstracts_sha256": _digest(arxiv.ABSTRACTS)}, arxiv.arxiv_mini_splits),
    "bfcl": (lambda: tooluse.bfcl_source("")[0], lambda: tooluse.bfcl_source("")[1]()),
    "gsm8k": (lambda: {"file_sha256": sha256_file(math_gsm8k.gsm8k_file())}, math_gsm8k.gsm8k_splits),
    "completion-humaneval": (lambda: {"file_sha256": sha256_file(coding.humaneval_file()), "pairs": 1},
                             completion.humaneval_pairs_splits),
    "travel-bfcl": (travel.travel_digest, travel.travel_splits),
    "coophumaneval": (lambda: {"coop_hf": coding.COOP_HUMANEVAL}, lambda: coding.coop_source("")[1]()),
}
PREFIXES = {"mbpp:": coding.mbpp_source, "coophumaneval:": coding.coop_source, "arxiv:": arxiv.arxiv_source,
            "bfcl:": tooluse.bfcl_source, "gsm8k:": math_gsm8k.gsm8k_source,
            "classeval:": completion.classeval_source}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()
