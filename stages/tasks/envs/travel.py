"""Travel-booking environment (BFCL multi-turn): agents call a booking API turn by turn against a simulator.

Each task is a conversation of 2-6 user requests to a travel-booking system (BFCL v4 `multi_turn_base`
and `multi_turn_miss_param`, the tasks that use only its TravelAPI: flight costs, bookings, credit cards,
budgets, insurance, ...), the system's starting state and the ground-truth calls of every turn. The
**planner** names the functions this turn needs; the **executor** writes the calls as Python. The calls
run against the pure-Python TravelAPI simulator that `bfcl-eval` ships; the next turn's prompt shows
each call's result (or its error) and the user's next request.

State is never shared between branches of the rollout tree: every call of the reward or the transition
builds a fresh simulator from the task's starting state and replays the executor's calls along that
branch (`_history`, see `stages.tasks.transitions`), then this turn's calls. Calls are parsed, never
evaluated: the function must be one of the API's documented functions and the arguments literals; a
call that cannot be read, names another function or raises inside the simulator becomes a one-line
error in the feedback, never an exception that stops training.

Reward of a turn (range 0..1, partial credit declared):

    reward = 0.2 · plan + 0.4 · calls + 0.4 · state          (one agent: 0.5 · calls + 0.5 · state)
    plan   = F1 of the planned names against this turn's ground-truth calls (tooluse.plan_f1)
    calls  = this turn's calls against the ground truth's (tooluse.match_calls, exact values)
    state  = 1 when the simulator after this turn equals the one the ground-truth calls of turns 0..t
             leave (the simulator's own equality: every public attribute), else 0

Data: `taskset.name: travel-bfcl` (26 tasks: every 5th to eval); needs `pip install --no-deps bfcl-eval`.
"""

import copy
import json

import coopflow.stages.tasks.envs.tooluse as tooluse

CATEGORIES = ("multi_turn_base", "multi_turn_miss_param")
DONE = "All requests are done. Make no further calls."


# --- data -----------------------------------------------------------------------------------------


def _function_docs() -> list[dict]:
    f = tooluse.bfcl_data_dir() / "multi_turn_func_doc" / "travel_booking.json"
    return tooluse._jsonl(f)


def travel_items() -> list[dict]:
    """The TravelAPI-only tasks of the categories, each with its user turns, starting state and answers."""
    d, docs, out = tooluse.bfcl_data_dir(), _function_docs(), []
    for cat in CATEGORIES:
        answers = {a["id"]: a["ground_truth"] for a in tooluse._jsonl(d / "possible_answer" / f"BFCL_v4_{cat}.json")}
        for row in tooluse._jsonl(d / f"BFCL_v4_{cat}.json"):
            if row.get("involved_classes") != ["TravelAPI"]:
                continue
            turns = ["\n".join(m["content"] for m in t if m.get("role") == "user") for t in row["question"]]
            excluded = set(row.get("excluded_function") or [])
            out.append({"task_id": row["id"], "category": cat, "prompt": turns[0], "turns": turns,
                        "ground_truth": answers[row["id"]], "initial_config": row["initial_config"]["TravelAPI"],
                        "functions": [f for f in docs if f["name"] not in excluded]})
    return out


def travel_splits() -> dict[str, list[dict]]:
    """{'train': 20 tasks, 'eval': 6}: every 5th to eval."""
    rows = travel_items()
    return {"train": [r for i, r in enumerate(rows) if i % 5], "eval": [r for i, r in enumerate(rows) if i % 5 == 0]}


def travel_digest() -> dict:
    from coopflow.artifacts import sha256_file

    d = tooluse.bfcl_data_dir()
    return {c: [sha256_file(d / f"BFCL_v4_{c}.json"), sha256_file(d / "possible_answer" / f"BFCL_v4_{c}.json")]
            for c in CATEGORIES} | {"docs": sha256_file(d / "multi_turn_func_doc" / "travel_booking.json")}


# --- the simulator ----------------------------------------------------------------------------------


def simulator(item: dict):
    """A fresh TravelAPI in the task's starting state."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.travel_booking import TravelAPI

    sim = TravelAPI()
    sim._load_scenario(copy.deepcopy(item["initial_config"]))
    return sim


def execute(sim, text: str, functions: list[dict]) -> list[str]:
    """Run the calls of one answer against `sim`, one result or error line per call (never raises)."""
    allowed = {f["name"] for f in functions}
    calls, bad = tooluse.parse_calls(text, functions)
    lines = []
    for name, args in calls:
        base = name.split(".")[-1]
        shown = f"{base}({', '.join(f'{k}={v!r}' for k, v in args.items())})"[:300]
        if base not in allowed or base.startswith("_"):
            lines.append(f"{shown} -> error: no function {base!r} in this API")
            continue
        try:
            result = getattr(sim, base)(**args)
        except Exception as err:  # the simulator's own error for bad arguments: feedback, not a crash
            lines.append(f"{shown} -> error: {type(err).__name__}: {str(err)[:200]}")
            continue
        lines.append(f"{shown} -> {json.dumps(result, default=str)[:500]}")
    if bad:
        lines.append(f"{bad} call(s) could not be read: write Python calls with literal arguments")
    return lines


def replay(item: dict, answers: list[str]):
    """The simulator after running the executor's answers of turns 0..t in order."""
    sim = simulator(item)
    for a in answers:
        execute(sim, a, item["functions"])
    return sim


def expected_calls(item: dict, turn: int) -> list[dict]:
    """Turn `turn`'s ground-truth calls as {name: {argument: [value]}} (none beyond the last turn)."""
    if turn >= len(item["ground_truth"]):
        return []
    out = []
    for name, args in tooluse.parse_calls("\n".join(item["ground_truth"][turn]), item["functions"])[0]:
        out.append({name: {k: [v] for k, v in args.items()}})
    return out


def ground_truth_state(item: dict, turn: int):
    return replay(item, ["\n".join(t) for t in item["ground_truth"][:turn + 1]])


# --- prompts (one formatter per role) ---------------------------------------------------------------


def _docs(item: dict) -> str:
    lines = []
    for f in item["functions"]:
        props = f.get("parameters", {}).get("properties", {})
        req = set(f.get("parameters", {}).get("required", []))
        sig = ", ".join(f"{k}: {v.get('type', 'any')}{'' if k in req else ' = optional'}" for k, v in props.items())
        lines.append(f"- {f['name']}({sig}): {f.get('description', '').split('.')[0]}.")
    return "\n".join(lines)


def planner_prompt(item: dict) -> str:
    """The planner: which functions this turn needs, names only."""
    return ("You plan calls to a travel-booking API. List the function(s) to call for the latest request, one name "
            "per line, once per call; list none if nothing is needed. Reply with the names only.\n\n"
            f"Functions:\n{_docs(item)}\n\n{item['prompt']}")


def executor_prompt(item: dict) -> str:
    """The executor: this turn's calls as Python with literal arguments."""
    return ("You call a travel-booking API. Write the call(s) the latest request needs as Python, one per line, with "
            "keyword arguments, e.g. get_flight_cost(travel_from='SFO', travel_to='LAX', travel_date='2024-11-15', "
            "travel_class='economy'). Write nothing if no call is needed. Reply with the calls only.\n\n"
            f"Functions:\n{_docs(item)}\n\n{item['prompt']}")


# --- multi-turn: results and the next request ---------------------------------------------------------


def travel_feedback(*, prompt: str, agent_completions: list[str], num_agents: int, item: dict,
                    prompt_history_per_agent=None, response_history_per_agent=None) -> list[str]:
    """The next turn's prompt for every agent: this turn's call results (from a replay of the branch) and the
    user's next request."""
    history = (response_history_per_agent or [[c] for c in agent_completions])[-1]
    sim = replay(item, history[:-1])
    results = execute(sim, history[-1], item["functions"])
    turn = len(history) - 1
    nxt = item["turns"][turn + 1] if turn + 1 < len(item["turns"]) else DONE
    shown = "\n".join(results) if results else "(no calls were made)"
    return [f"Results of the last calls:\n{shown}\n\nNext request: {nxt}"] * num_agents


# --- the reward -------------------------------------------------------------------------------------


def score_turn(item: dict, turn: int, history: list[str], executor: str, planner: str | None) -> dict:
    """One turn's score details (see the module docstring)."""
    want = expected_calls(item, turn)
    calls, bad = tooluse.parse_calls(executor, item["functions"])
    m = tooluse.match_calls(calls, want)
    state = float(replay(item, [*history, executor]) == ground_truth_state(item, turn))
    if planner is None:
        return {"reward": 0.5 * m["score"] + 0.5 * state, "calls": m["score"], "state": state, "plan": None,
                "unreadable": bad}
    plan = tooluse.plan_f1(planner, want, item["functions"])
    return {"reward": 0.2 * plan + 0.4 * m["score"] + 0.4 * state, "calls": m["score"], "state": state,
            "plan": plan, "unreadable": bad}


def travel_reward(*completions: list[str], batch_items: list[dict]) -> list[float]:
    """The shared reward of a turn's joint answers: (planner, executor) or (executor,)."""
    execs = completions[-1]
    plans = completions[0] if len(completions) > 1 else [None] * len(execs)
    out = []
    for it, e, p in zip(batch_items, execs, plans):
        history = (it.get("_history") or [[]])[-1]
        out.append(score_turn(it, it.get("_turn", 0), history, e, p)["reward"])
    return out


travel_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]
travel_reward.required_fields = ('initial_config', 'functions', 'ground_truth', 'turns')  # type: ignore[attr-defined]


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None, items=None) -> list[dict]:
    """Per eval episode: every turn's score, replayed from the start, and the final state's match."""
    out = []
    for j, it in enumerate(items):
        execs = agent_completions_turns[-1][j]
        plans = agent_completions_turns[0][j] if len(agent_completions_turns) > 1 else [None] * len(execs)
        turns = [score_turn(it, t, execs[:t], execs[t], plans[t]) for t in range(len(execs))]
        out.append({"final_state": turns[-1]["state"], "calls": sum(t["calls"] for t in turns) / len(turns),
                    "reward": sum(t["reward"] for t in turns) / len(turns),
                    "unreadable": sum(t["unreadable"] for t in turns)})
    return out


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """How often the final state matched, the mean per-turn call score and reward, unreadable calls."""
    n = max(1, len(detailed))
    return {"travel/final_state_match_rate": sum(d["final_state"] for d in detailed) / n,
            "travel/call_score_mean": sum(d["calls"] for d in detailed) / n,
            "travel/turn_reward_mean": sum(d["reward"] for d in detailed) / n,
            "travel/unreadable_calls_per_episode": sum(d["unreadable"] for d in detailed) / n}
