"""pyarrow schemas of every Parquet artifact kind (with a `schema_version` in the metadata).

Per-agent values are rows with an `agent` column, never a column per agent, so the agent count
stays a runtime parameter. A reader checks the stored schema equals the declared one.

Kinds:
- taskset      one row per task item
- rollouts     one row per (step, node, agent, sample): token ids, text and length of a completion; a node
               is one item at one turn, and multi-turn trees link each node to its parent joint action
- scores       one row per joint action: its per-agent sample combo and shared reward
- advantages   one row per (step, item, agent, sample): the return and the advantage fed to the update
- metrics      one row per logged metric point (key, value, env_step)
- eval         one row per (eval item, agent): the single-path completion and the joint reward
- ac_samples   actor-critic: one row per (step, node, agent, sample): reward, KL, old value, TD target,
               MC return, advantage (raw and normalized) — what the actor and critic updates consume
- pairs        preference learning: one row per (pair, agent) with TRL-style prompt / chosen / rejected
- steps        a training manifest: one row per update with the keys of its rollouts/scores/advantages
"""

import pyarrow as pa

SCHEMA_VERSION = "6"  # 2: rollouts.ref_kl; 3: rollouts.parent_node/parent_joint (trees); 4: scores.agent_rewards,
# ac_samples; 5: steps.signal/signal_kind (the learning-signal artifact of an update: advantages, ac_samples or
# pairs); 6: eval.sample (several sampled paths per eval item)

_i32, _i64, _f64, _str, _bool = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()


def _schema(kind: str, fields: list[tuple[str, pa.DataType]]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=(t == _str)) for n, t in fields],
                     metadata={"artifact": kind, "schema_version": SCHEMA_VERSION})


TABLES: dict[str, pa.Schema] = {
    "taskset": _schema("taskset", [
        ("item_id", _i64), ("split", _str), ("prompt", _str), ("fields", _str),  # fields: JSON of the row
    ]),
    "rollouts": _schema("rollouts", [
        ("step", _i64), ("item_id", _i64), ("turn", _i32), ("node_id", _i64), ("agent", _i32), ("sample", _i32),
        ("prompt", _str), ("prompt_ids", pa.list_(_i32)), ("completion_ids", pa.list_(_i32)),
        ("completion_text", _str), ("length", _i32), ("finished", _bool), ("ref_kl", _f64),
        ("parent_node", _i64), ("parent_joint", _i32),  # -1 at a root; else the parent node and its joint action
    ]),
    "scores": _schema("scores", [
        ("step", _i64), ("item_id", _i64), ("turn", _i32), ("node_id", _i64), ("joint_idx", _i32),
        ("combo", pa.list_(_i32)), ("reward_raw", _f64), ("reward", _f64), ("env_step", _i64),
        ("agent_rewards", pa.list_(_f64)),  # actor-critic: per-agent rewards (reward = their mean); MAGRPO family:
        # the per-agent local rewards of a reward that returns [team, local_1..N] (else empty)
    ]),
    "ac_samples": _schema("ac_samples", [
        ("step", _i64), ("item_id", _i64), ("turn", _i32), ("node_id", _i64), ("agent", _i32), ("sample", _i32),
        ("reward", _f64), ("ref_kl", _f64), ("shaped_reward", _f64), ("old_value", _f64), ("value_target", _f64),
        ("mc_return", _f64), ("advantage", _f64), ("norm_advantage", _f64),
    ]),
    "advantages": _schema("advantages", [
        ("step", _i64), ("item_id", _i64), ("turn", _i32), ("node_id", _i64), ("agent", _i32), ("sample", _i32),
        ("return", _f64), ("advantage", _f64),
    ]),
    "pairs": _schema("pairs", [  # one row per (pair, agent); prompt/chosen/rejected are TRL's DPO columns
        ("pair_id", _i64), ("item_id", _i64), ("agent", _i32), ("winner", _i32), ("loser", _i32),
        ("winner_reward", _f64), ("loser_reward", _f64), ("candidate_reward_mean", _f64),
        ("prompt", _str), ("chosen", _str), ("rejected", _str),
        ("prompt_ids", pa.list_(_i32)), ("chosen_ids", pa.list_(_i32)), ("rejected_ids", pa.list_(_i32)),
    ]),
    "metrics": _schema("metrics", [("key", _str), ("value", _f64), ("env_step", _i64)]),
    "eval": _schema("eval", [
        ("item_id", _i64), ("sample", _i32), ("turn", _i32), ("agent", _i32), ("prompt", _str),
        ("completion_text", _str), ("reward", _f64), ("return", _f64),
    ]),
    "steps": _schema("steps", [
        ("update", _i64), ("epoch", _i32), ("env_step", _i64), ("rollouts", _str), ("scores", _str),
        ("signal", _str), ("signal_kind", _str), ("reward_mean", _f64),
    ]),
}

DIR_KINDS = ("checkpoint", "model", "critic", "reward_model", "drift", "dataset")
"""Artifact kinds stored as directories (HF save_pretrained / datasets save_to_disk dirs plus a manifest), not tables."""


def schema_for(kind: str) -> pa.Schema:
    """The declared schema of a table kind; KeyError names the known kinds."""
    try:
        return TABLES[kind]
    except KeyError:
        raise KeyError(f"unknown artifact kind {kind!r}; known: {sorted(TABLES)}") from None
