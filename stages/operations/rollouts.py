"""A run's joint answers as one table, read from the store alone (no model, no config, no server).

A run of online RL (the MAGRPO family, IAC, MAAC) is named by its **run key**, the key of its final checkpoint.
That checkpoint's `trainer_state.json` lists the steps manifest of every segment, and each manifest row names one
update's artifacts: its `rollouts` (one row per agent's sampled completion), its `scores` (one row per joint
action: which sample of each agent it combines, `combo`, and the shared reward) and its learning signal
(`advantages`, or `ac_samples` for the actor-critic trainers). Joining them gives one row per agent of every joint
action (`COLUMNS`): what each agent wrote, the reward the joint answer got and the advantage the update gave that
agent's completion. The final evaluation of the run's checkpoint (an `eval` table) joins the same way.

A preference run (MADPO, or a round of an iterative run) trains on preference pairs instead: its checkpoint's
manifest names the `pairs` table, and each pair becomes two joint actions, the chosen answers (`joint` 0) and the
rejected ones (`joint` 1), with the task reward that ranked them (`advantage` is empty: DPO has none).
"""

from dataclasses import dataclass

from coopflow.artifacts import ArtifactError, ArtifactStore
from coopflow.schemas.config import data_dir_path
from coopflow.stages.agents.checkpoint import CheckpointLayout, find_checkpoint, policy_key_of
from coopflow.stages.operations.gc import written_at

COLUMNS = ("run_key", "update", "env_step", "item_id", "turn", "node_id", "joint", "agent", "sample", "prompt",
           "completion", "reward", "agent_reward", "advantage", "length", "finished", "parent_node", "parent_joint")
"""Columns of a run's joint-answer table: one row per agent of each joint action of each update. `joint` is the
joint action's index at its tree node (aligned joint mode: the sample index), `sample` the agent's own sample in
it, `reward` the joint action's (processed) reward, `agent_reward` the agent's own share where the reward gives one
(IAC/MAAC per-agent rewards, local rewards), `advantage` the advantage the update gave this completion;
`parent_node` / `parent_joint` link a later turn's node to the node and joint action it continues (-1 at turn 1),
so a multi-turn episode is followed by joining them to `node_id` / `joint`."""

EVAL_COLUMNS = ("run_key", "item_id", "sample", "turn", "agent", "prompt", "completion", "reward")
"""Columns of a run's final-evaluation table: one row per agent of each evaluated joint answer."""


class UnknownRun(LookupError):
    """No run of that name in the store (the message names the runs there are)."""


@dataclass(frozen=True)
class RunInfo:
    """A run found in the store: its key, updates, env steps, segments and when its checkpoint was written."""

    key: str
    updates: int
    env_steps: int
    segments: tuple[str, ...]  # the steps manifest key of every segment, in order
    segment_ends: tuple[str, ...]  # the checkpoint (policy) key every segment ended at, in order
    written_at: float
    preference: bool = False  # trained on preference pairs (MADPO, an iterative round): joint 0 chosen, 1 rejected


# --- finding runs ------------------------------------------------------------------------------------


def runs(store: ArtifactStore) -> list[RunInfo]:
    """Every run in the store (online RL and preference runs), newest first: the checkpoints that end a run (a
    checkpoint that only ends a segment of a longer run is listed with that run, not on its own)."""
    found = []
    for _, key in store.artifacts("checkpoint"):
        info = _info(store, key)
        if info is not None:
            found.append(info)
    inner = {k for i in found for k in i.segment_ends[:-1]}
    return sorted((i for i in found if i.key not in inner), key=lambda i: -i.written_at)


def find_run(store: ArtifactStore, run: str | None = None) -> RunInfo:
    """The run named `run` (its run key, or a unique prefix of it; None: the newest run). Raises UnknownRun with
    one line naming the runs there are."""
    known = runs(store)
    if run is None:
        if not known:
            raise UnknownRun(f"no training run in the store at {store.root}: run one first (coopflow run ...)")
        return known[0]
    key = policy_key_of(run)
    exact = _info(store, key)
    if exact is not None:
        return exact
    matches = [i for i in known if i.key.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    names = ", ".join(i.key[:12] for i in known[:10]) + (" ..." if len(known) > 10 else "")
    what = "matches several runs" if matches else "is not a run in the store"
    raise UnknownRun(f"run {run!r} {what} at {store.root}; runs there (newest first): {names or 'none'}")


def open_run(run: str | None = None, data_dir: str | None = None) -> tuple[ArtifactStore, RunInfo]:
    """The store of `data_dir` (default: $COOPFLOW_HOME, else ./.coopflow) and the run named `run` in it (its run
    key or a unique prefix; None: the newest). Raises `UnknownRun` naming the runs there are."""
    store = ArtifactStore.at(data_dir_path(data_dir))
    if not store.root.is_dir():
        raise UnknownRun(f"no store at {store.root}: pass the data dir the run used (data_dir / --data-dir)")
    return store, find_run(store, run)


def select_updates(store: ArtifactStore, info: RunInfo, updates) -> list[int] | None:
    """`updates` as update indices: None (all), an int, 'first', 'last' or several of them."""
    if updates is None:
        return None
    done = [s["update"] for s in update_manifest(store, info)]
    picks = [updates] if isinstance(updates, (int, str)) else list(updates)
    out = []
    for u in picks:
        if u in ("first", "last"):
            out.append(done[0] if u == "first" else done[-1])
        elif isinstance(u, int) or (isinstance(u, str) and u.isdigit()):
            if int(u) not in done:
                raise ValueError(f"update {u} is not an update of run {info.key[:12]} (it has updates "
                                 f"{done[0]}..{done[-1]})")
            out.append(int(u))
        else:
            raise ValueError(f"update {u!r}: give an update index, 'first' or 'last'")
    return out


def _info(store: ArtifactStore, key: str) -> RunInfo | None:
    ref = find_checkpoint(store, policy_key_of(key))
    if ref is None:
        return None
    state = CheckpointLayout(store.open_dir(ref, verify=False)).trainer_state()
    steps = state.get("segment_steps")
    if not steps:  # a preference run's checkpoint: MADPO's manifest under its own key, or a round's pairs shard
        key = policy_key_of(ref.key)
        manifest = store.find("steps", key)
        rows = store.read_rows(manifest) if manifest is not None else []
        if rows and any(r["signal_kind"] != "pairs" for r in rows):
            return None
        if not rows and store.find("pairs", key) is None:
            return None
        return RunInfo(key, int(state.get("update", len(rows))), int(state.get("env_step", 0)),
                       (key,) if rows else (), (key,), written_at(store, "checkpoint", ref.key), preference=True)
    return RunInfo(policy_key_of(ref.key), int(state.get("update", 0)), int(state.get("env_step", 0)),
                   tuple(steps), tuple(state.get("segment_keys", ())), written_at(store, "checkpoint", ref.key))


# --- the joined tables --------------------------------------------------------------------------------


def pairs_step(pairs_key: str, env_step: int, update: int = 0) -> dict:
    """A `steps` manifest row for an update that trained on the pairs `pairs_key` (a round keeps no manifest)."""
    return {"update": update, "epoch": 0, "env_step": env_step, "rollouts": "", "scores": "", "signal": pairs_key,
            "signal_kind": "pairs", "reward_mean": None}


def update_manifest(store: ArtifactStore, info: RunInfo) -> list[dict]:
    """The run's `steps` rows (one per update, in order): update, epoch, env_step and its artifacts' keys (an
    iterative round, which keeps no manifest: one row naming its pairs shard, stored under the round's key)."""
    if info.preference and not info.segments:
        return [pairs_step(info.key, info.env_steps, info.updates)]
    rows = []
    for key in info.segments:
        ref = store.find("steps", key)
        if ref is None:
            raise ArtifactError(f"the steps manifest {key} of run {info.key[:12]} is not in the store (deleted by "
                                "`coopflow gc`?): its rollouts cannot be joined")
        rows += store.read_rows(ref)
    return rows


def joint_rows(store: ArtifactStore, info: RunInfo, updates: list[int] | None = None) -> list[dict]:
    """The joint-answer rows (`COLUMNS`) of the run's updates (`updates`: their indices; None: all)."""
    out, seen_pairs = [], set()
    for step in update_manifest(store, info):
        if updates is not None and step["update"] not in updates:
            continue
        if step["signal_kind"] == "pairs":  # every DPO update of a run draws from the same pairs: listed once
            if step["signal"] in seen_pairs:
                continue
            seen_pairs.add(step["signal"])
        out += update_rows(store, info.key, step)
    return out


def update_rows(store: ArtifactStore, run_key: str, step: dict) -> list[dict]:
    """The joint-answer rows (`COLUMNS`) of one update, from its `steps` manifest row."""
    if step["signal_kind"] == "pairs":
        return pair_rows(store, run_key, step)
    refs = {kind: store.find(kind, step[col]) for kind, col in
            (("rollouts", "rollouts"), ("scores", "scores"), (step["signal_kind"], "signal"))}
    missing = [k for k, r in refs.items() if r is None]
    if missing:
        raise ArtifactError(f"update {step['update']} of run {run_key[:12]}: its {', '.join(missing)} "
                            "artifact(s) are not in the store (deleted by `coopflow gc`?)")
    rollouts = {(r["turn"], r["node_id"], r["agent"], r["sample"]): r for r in store.read_rows(refs["rollouts"])}
    signal = store.read_rows(refs[step["signal_kind"]])
    adv_col = "norm_advantage" if step["signal_kind"] == "ac_samples" else "advantage"
    advantage = {(a["turn"], a["node_id"], a["agent"], a["sample"]): a[adv_col] for a in signal}
    out = []
    for s in sorted(store.read_rows(refs["scores"]), key=lambda s: (s["turn"], s["node_id"], s["joint_idx"])):
        for agent, sample in enumerate(s["combo"]):
            r = rollouts.get((s["turn"], s["node_id"], agent, sample))
            if r is None:
                continue
            own = s["agent_rewards"] or []
            out.append({"run_key": run_key, "update": step["update"], "env_step": step["env_step"],
                        "item_id": s["item_id"], "turn": s["turn"], "node_id": s["node_id"], "joint": s["joint_idx"],
                        "agent": agent, "sample": sample, "prompt": r["prompt"], "completion": r["completion_text"],
                        "reward": s["reward"], "agent_reward": own[agent] if agent < len(own) else None,
                        "advantage": advantage.get((s["turn"], s["node_id"], agent, sample)),
                        "length": r["length"], "finished": r["finished"],
                        "parent_node": r["parent_node"], "parent_joint": r["parent_joint"]})
    return out


def pair_rows(store: ArtifactStore, run_key: str, step: dict) -> list[dict]:
    """A preference update's pairs as joint-answer rows (`COLUMNS`): per pair, the chosen answers of every agent
    (`joint` 0, the winner's task reward) and the rejected ones (`joint` 1, the loser's)."""
    ref = store.find("pairs", step["signal"])
    if ref is None:
        raise ArtifactError(f"update {step['update']} of run {run_key[:12]}: its pairs artifact {step['signal']} is "
                            "not in the store (deleted by `coopflow gc`?)")
    out = []
    for p in sorted(store.read_rows(ref), key=lambda p: (p["pair_id"], p["agent"])):
        for joint, (side, sample, reward) in enumerate((("chosen", p["winner"], p["winner_reward"]),
                                                       ("rejected", p["loser"], p["loser_reward"]))):
            text = p[side]
            out.append({"run_key": run_key, "update": step["update"], "env_step": step["env_step"],
                        "item_id": p["item_id"], "turn": 0, "node_id": p["pair_id"], "joint": joint,
                        "agent": p["agent"], "sample": sample, "prompt": p["prompt"], "completion": text,
                        "reward": reward, "agent_reward": None, "advantage": None,
                        "length": len(p[f"{side}_ids"] or []), "finished": None, "parent_node": -1,
                        "parent_joint": -1})
    return out


def eval_rows(store: ArtifactStore, info: RunInfo) -> list[dict]:
    """The final evaluation of the run's checkpoint (`EVAL_COLUMNS`), from the newest `eval` artifact recorded for
    it; [] when the run was not evaluated (or was evaluated before evaluations recorded their checkpoint)."""
    newest, best = None, -1.0
    for _, key in store.artifacts("eval"):
        ref = store.find("eval", key)
        if ref is None or store.table_meta(ref).get("checkpoint") != info.key:
            continue
        when = written_at(store, "eval", key)
        if when > best:
            newest, best = ref, when
    return [] if newest is None else eval_table_rows(store, newest, info.key)


def eval_table_rows(store: ArtifactStore, ref, run_key: str) -> list[dict]:
    """The rows (`EVAL_COLUMNS`) of the eval artifact `ref`."""
    return [{"run_key": run_key, "item_id": r["item_id"], "sample": r["sample"], "turn": r["turn"],
             "agent": r["agent"], "prompt": r["prompt"], "completion": r["completion_text"], "reward": r["reward"]}
            for r in store.read_rows(ref)]


# --- the same joint answers as tables a person reads (MLflow) -----------------------------------------


def logged_updates(setting, updates: list[int], last_update: int) -> list[int]:
    """Which of `updates` a `tracking.rollouts` setting logs: all, every Nth (and the run's last), none (eval/none)."""
    if setting == "all":
        return list(updates)
    if isinstance(setting, int):
        return [u for u in updates if u % setting == 0 or u == last_update]
    return []


def pairs_table(store: ArtifactStore, run_key: str, pairs_key: str, env_step: int) -> tuple[list[str], list[list]]:
    """The pairs `pairs_key` that trained run `run_key` (its env_step at the end) as one joint-answer table (MLflow's
    `rollouts/pairs.json` of a MADPO run and of each iterative round)."""
    return joint_table(pair_rows(store, run_key, pairs_step(pairs_key, env_step)))


def joint_table(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Joint-answer rows (`COLUMNS`) as one row per joint action, agents side by side: (columns, rows) with update,
    item_id, reward, each agent's completion, each completion's advantage, then turn, joint, env_step and each
    agent's prompt (what a reader looks at first comes first: the UI's table scrolls sideways)."""
    agents = sorted({r["agent"] for r in rows})
    cols = ["update", "item_id", "reward", *[f"agent_{a}" for a in agents], *[f"advantage_{a}" for a in agents],
            "turn", "joint", "env_step", *[f"prompt_{a}" for a in agents]]
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["update"], r["turn"], r["node_id"], r["joint"]), {})[r["agent"]] = r
    data = []
    for key in sorted(groups):
        g = groups[key]
        r0 = next(iter(g.values()))
        data.append([r0["update"], r0["item_id"], r0["reward"],
                     *[g[a]["completion"] if a in g else None for a in agents],
                     *[g[a]["advantage"] if a in g else None for a in agents],
                     r0["turn"] + 1, r0["joint"], r0["env_step"], *[g[a]["prompt"] if a in g else None for a in agents]])
    return cols, data


def eval_table(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Evaluation rows (`EVAL_COLUMNS`) as one row per evaluated joint answer: item_id, sample, reward, each agent's
    completion, turn and each agent's prompt."""
    agents = sorted({r["agent"] for r in rows})
    cols = ["item_id", "sample", "reward", *[f"agent_{a}" for a in agents], "turn", *[f"prompt_{a}" for a in agents]]
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["item_id"], r["sample"], r["turn"]), {})[r["agent"]] = r
    data = []
    for key in sorted(groups):
        g = groups[key]
        r0 = next(iter(g.values()))
        data.append([r0["item_id"], r0["sample"], r0["reward"], *[g[a]["completion"] if a in g else None for a in agents],
                     r0["turn"] + 1, *[g[a]["prompt"] if a in g else None for a in agents]])
    return cols, data
