"""Tool-use environment (BFCL): a planner and an executor answer a function-calling request together.

Each task is a user request and the documentation of one or more functions (BFCL v4, shipped by the
`bfcl-eval` package: categories `simple_python`, `multiple` (pick one of 2-4 functions), `parallel` (call
one function several times) and `parallel_multiple`). The **planner** names the function(s) to call, one
per line; the **executor** writes the calls as Python (`f(x=1)`, one per line or a list). A single-agent
variant keeps only the executor (`num_agents: 1` + `executor_prompt`).

Reward of a joint answer (range 0..1, partial credit declared):

    reward = 0.2 · plan + 0.8 · calls          (one agent: calls)
    plan   = F1 of the planned function names against the ground truth's (as multisets)
    calls  = Σ over matched (call, expected call) pairs of its score / max(#calls, #expected calls)
    score of a call = 0 for another function, else 0.5 + 0.5 · (right arguments / (expected + extra ones))

Calls are matched to the expected ones in the order that scores best (parallel calls are unordered).
An argument is right when its value is one of the possible answers, compared as BFCL's AST checker
does: strings without spaces or the characters `,./-_*^` and in lower case, numbers by value (an
integer is a fine float), lists element-wise, dicts key by key; an argument the answers allow to be
omitted ("" among them) may be left out. Positional arguments are read in the documented parameter order.
A call is *exact* when every argument is right and none is extra; an answer is exact when every expected
call has an exact match and there are no other calls (BFCL's accuracy, `eval/bfcl/exact_rate`).

Data: `taskset.name: bfcl` (the four categories interleaved, every 5th task to eval) or
`bfcl:<category>[,<category>...]`; needs `pip install --no-deps bfcl-eval` (Apache-2.0).
"""

import ast
import importlib.util
import itertools
import json
import math
import re
from pathlib import Path

from coopflow.stages.common.syntax import parse
from coopflow.stages.tasks.envs.coding import extract_code

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
_STRIP = re.compile(r"[ ,./\-_*^]")


# --- data -----------------------------------------------------------------------------------------


def bfcl_data_dir() -> Path:
    """bfcl_eval/data inside the installed `bfcl-eval` package (a clear error naming pip when absent)."""
    spec = importlib.util.find_spec("bfcl_eval")
    for root in (spec.submodule_search_locations or []) if spec else []:
        d = Path(root) / "data"
        if (d / "possible_answer").is_dir():
            return d
    raise FileNotFoundError("taskset 'bfcl' needs the PyPI package bfcl-eval (its bundled BFCL v4 data): "
                            "pip install --no-deps bfcl-eval")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def bfcl_items(category: str) -> list[dict]:
    """One category's tasks: id, category, the user request, the function docs and the possible answers."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; single-turn categories: {list(CATEGORIES)}")
    d = bfcl_data_dir()
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(d / "possible_answer" / f"BFCL_v4_{category}.json")}
    out = []
    for row in _jsonl(d / f"BFCL_v4_{category}.json"):
        request = "\n".join(m["content"] for m in row["question"][0] if m.get("role") == "user")
        out.append({"task_id": row["id"], "category": category, "prompt": request, "functions": row["function"],
                    "ground_truth": answers[row["id"]]})
    return out


def bfcl_source(spec: str):
    """(digest, loader) of `bfcl` / `bfcl:<cat>[,<cat>...]`: the categories interleaved, every 5th task to eval."""
    cats = [c.strip() for c in (spec or ",".join(CATEGORIES)).split(",") if c.strip()]
    for c in cats:
        if c not in CATEGORIES:
            raise ValueError(f"unknown BFCL category {c!r}; single-turn categories: {list(CATEGORIES)}")

    def load() -> dict[str, list[dict]]:
        per = [bfcl_items(c) for c in cats]
        rows = [it for group in itertools.zip_longest(*per) for it in group if it is not None]
        return {"train": [r for i, r in enumerate(rows) if i % 5], "eval": [r for i, r in enumerate(rows) if i % 5 == 0]}

    from coopflow.artifacts import sha256_file

    d = bfcl_data_dir()
    digest = {c: [sha256_file(d / f"BFCL_v4_{c}.json"), sha256_file(d / "possible_answer" / f"BFCL_v4_{c}.json")]
              for c in cats}
    return {"bfcl": digest}, load


# --- prompts (one formatter per role) ---------------------------------------------------------------


def _docs(item: dict) -> str:
    return json.dumps(item["functions"], indent=1)


def planner_prompt(item: dict) -> str:
    """The planner's task: which function(s) answer the request, names only."""
    return ("You plan function calls. Given the user's request and the available functions, list the function(s) "
            "to call to answer it, one name per line, once per call (a function called twice is listed twice). "
            "Reply with the names only.\n\n"
            f"Functions:\n{_docs(item)}\n\nRequest: {item['prompt']}")


def executor_prompt(item: dict) -> str:
    """The executor's task: the call(s) with their arguments, as Python."""
    return ("You write function calls. Given the user's request and the available functions, write the call(s) "
            "that answer it as Python, one per line, with keyword arguments, e.g. area(base=10, height=5). "
            "Reply with the calls only.\n\n"
            f"Functions:\n{_docs(item)}\n\nRequest: {item['prompt']}")


# --- parsing and matching ---------------------------------------------------------------------------


def _norm_name(name: str) -> str:
    return name.strip().replace(".", "_").lower()


def parse_calls(text: str, functions: list[dict] | None = None) -> tuple[list[tuple[str, dict]], int]:
    """(calls as (name, {argument: value}), how many call-like lines could not be read). Reads the first fenced
    block or the whole text: Python calls, one per line or in a list; positional arguments are named in the
    documented parameter order; values must be literals."""
    order = {_norm_name(f["name"]): list(f.get("parameters", {}).get("properties", {})) for f in functions or []}
    code = extract_code(text)
    try:
        chunks = [parse(code)]
    except SyntaxError:
        chunks = []
        for line in code.splitlines():
            try:
                chunks.append(parse(line.strip().rstrip(",")))
            except SyntaxError:
                continue
    calls, bad = [], 0
    for tree in chunks:
        for stmt in tree.body:
            if not isinstance(stmt, ast.Expr):
                continue
            nodes = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
            for node in nodes:
                if not isinstance(node, ast.Call):
                    continue
                name = ast.unparse(node.func)
                try:
                    args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
                    names = order.get(_norm_name(name), [])
                    for i, a in enumerate(node.args):
                        args[names[i] if i < len(names) else f"_positional_{i}"] = ast.literal_eval(a)
                except (ValueError, SyntaxError, TypeError):
                    bad += 1
                    continue
                calls.append((name, args))
    return calls, bad


def _std(s: str) -> str:
    return _STRIP.sub("", s).lower().replace("'", '"')


def value_matches(value, accepted) -> bool:
    """One value against one possible answer (see the module docstring)."""
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted
    if isinstance(accepted, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(accepted)
    if isinstance(accepted, str) and isinstance(value, str):
        return _std(value) == _std(accepted)
    if isinstance(accepted, (list, tuple)) and isinstance(value, (list, tuple)):
        return len(value) == len(accepted) and all(value_matches(v, a) for v, a in zip(value, accepted))
    if isinstance(accepted, dict) and isinstance(value, dict):
        if set(value) - set(accepted):
            return False
        return all((k in value and any(value_matches(value[k], o) for o in opts)) or (k not in value and "" in opts)
                   for k, opts in ((k, v if isinstance(v, list) else [v]) for k, v in accepted.items()))
    return False


def call_score(call: tuple[str, dict], expected: dict) -> tuple[float, bool]:
    """(score, exact) of one call against one expected call {name: {param: [possible values]}}."""
    (gt_name, params), = expected.items()
    name, args = call
    if _norm_name(name) != _norm_name(gt_name):
        return 0.0, False
    right = sum((p in args and any(value_matches(args[p], o) for o in opts if o != "")) or
                (p not in args and "" in opts) for p, opts in params.items())
    extra = len(set(args) - set(params))
    total = len(params) + extra
    return (0.5 + 0.5 * (right / total if total else 1.0)), right == len(params) and extra == 0


def match_calls(calls: list[tuple[str, dict]], expected: list[dict]) -> dict:
    """The best one-to-one matching of calls to expected calls: {'score', 'exact', 'matched'} (see docstring)."""
    if not expected:
        return {"score": 1.0 if not calls else 0.0, "exact": not calls, "matched": 0}
    table = [[call_score(c, e) for e in expected] for c in calls]
    big, small = max(len(calls), len(expected)), min(len(calls), len(expected))
    if math.perm(big, small) <= 5040:  # every assignment (BFCL's parallel tasks have at most 8 calls)
        if len(calls) >= len(expected):
            options = ([(r, c) for c, r in enumerate(rows)] for rows in itertools.permutations(range(len(calls)), small))
        else:
            options = (list(enumerate(cols)) for cols in itertools.permutations(range(len(expected)), small))
        best = max(((sum(table[r][c][0] for r, c in pairs), sum(table[r][c][1] for r, c in pairs))
                    for pairs in options), default=(0.0, 0))
    else:  # a long list of calls: greedily, best pair first
        cells = sorted(((table[r][c], r, c) for r in range(len(calls)) for c in range(len(expected))), reverse=True)
        used_r, used_c, best = set(), set(), (0.0, 0)
        for (sc, ex), r, c in cells:
            if r not in used_r and c not in used_c:
                used_r.add(r), used_c.add(c)
                best = (best[0] + sc, best[1] + ex)
    return {"score": best[0] / big, "exact": len(calls) == len(expected) and best[1] == len(expected),
            "matched": best[1]}


def plan_f1(plan_text: str, expected: list[dict], functions: list[dict]) -> float:
    """F1 of the planned names (lines naming a documented function) against the expected calls' names."""
    known = {_norm_name(f["name"]) for f in functions}
    planned = []
    for line in extract_code(plan_text).splitlines():
        for tok in re.findall(r"[A-Za-z_][\w.]*", line):
            if _norm_name(tok) in known:
                planned.append(_norm_name(tok))
                break
    want = [_norm_name(next(iter(e))) for e in expected]
    common = sum(min(planned.count(n), want.count(n)) for n in set(want))
    if not planned or not want:
        return float(planned == want)
    p, r = common / len(planned), common / len(want)
    return 0.0 if common == 0 else 2 * p * r / (p + r)


# --- the reward -------------------------------------------------------------------------------------


def score_answer(item: dict, executor: str, planner: str | None = None) -> dict:
    """Per joint answer: {'reward', 'calls', 'plan', 'exact', 'num_calls', 'unreadable'}."""
    calls, bad = parse_calls(executor, item["functions"])
    m = match_calls(calls, item["ground_truth"])
    plan = plan_f1(planner, item["ground_truth"], item["functions"]) if planner is not None else None
    reward = m["score"] if plan is None else 0.2 * plan + 0.8 * m["score"]
    return {"reward": reward, "calls": m["score"], "plan": plan, "exact": m["exact"], "num_calls": len(calls),
            "unreadable": bad, "category": item.get("category", "")}


def bfcl_reward(*completions: list[str], batch_items: list[dict]) -> list[float]:
    """The shared reward of joint answers: (planner, executor) for two agents, (executor,) for one."""
    execs = completions[-1]
    plans = completions[0] if len(completions) > 1 else [None] * len(execs)
    return [score_answer(it, e, p)["reward"] for it, e, p in zip(batch_items, execs, plans)]


bfcl_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
bfcl_reward.required_fields = ('functions', 'ground_truth')  # type: ignore[attr-defined]


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None, items=None) -> list[dict]:
    """Per eval item (last turn): the joint answer's score details. Needs the items (function docs, answers):
    evaluate passes them as `items` to a logger that declares it."""
    last = [[t[-1] for t in agent] for agent in agent_completions_turns]
    plans = last[0] if len(last) > 1 else [None] * len(last[-1])
    return [score_answer(it, e, p) for it, e, p in zip(items, last[-1], plans)]


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """BFCL accuracy (exact answers), the mean call and plan scores, unreadable calls, accuracy per category."""
    n = max(1, len(detailed))
    out = {"bfcl/exact_rate": sum(d["exact"] for d in detailed) / n,
           "bfcl/call_score_mean": sum(d["calls"] for d in detailed) / n,
           "bfcl/calls_per_answer": sum(d["num_calls"] for d in detailed) / n,
           "bfcl/unreadable_calls_per_answer": sum(d["unreadable"] for d in detailed) / n}
    plans = [d["plan"] for d in detailed if d["plan"] is not None]
    if plans:
        out["bfcl/plan_f1_mean"] = sum(plans) / len(plans)
    for cat in sorted({d["category"] for d in detailed if d["category"]}):
        ds = [d for d in detailed if d["category"] == cat]
        out[f"bfcl/{cat}/exact_rate"] = sum(d["exact"] for d in ds) / len(ds)
    return out
