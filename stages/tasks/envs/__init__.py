"""Task environments: each a taskset source, per-role formatters, a shared reward with a `reward_range`,
evaluation hooks and (optionally) a multi-turn transition, named from configs by import path.

- `coding` (HumanEval): a helper and a main agent write a program together; sandboxed tests score it.

`TASKSETS` maps the built-in taskset names the environments add to (source digest, loader).
"""

from artifacts import sha256_file
from stages.tasks.envs import coding

TASKSETS = {
    "humaneval": (lambda: {"file_sha256": sha256_file(coding.humaneval_file())}, coding.humaneval_splits),
}
