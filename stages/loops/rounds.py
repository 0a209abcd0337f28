"""Iterative (online) MADPO and MARLHF: rounds of target-vs-comparator preferences, replay, then DPO or
a fresh reward model + RL.

MADPO-iter in plain words: each round, the current agents (target) and a comparator each answer
every task P times; the i-th target joint answer is compared with the i-th comparator joint answer
under the task reward (ties dropped); the selected pairs become this round's replay shard; the
round trains with DPO on pairs sampled from the shards (replay mode), evaluates, and checkpoints.
The comparator is the current agents on an independent RNG stream (`current`), a frozen copy of
them (`current_copy`), the checkpoint of k rounds back (`history`, falling back to the newest
earlier one, else the initial agents), frozen models (`model`) or an HTTP endpoint (`api`).

MARLHF-iter is the same round with a different training step: a fresh joint reward model is fitted
on the round's training pairs, then the RL backend (`rl_algorithm`: the MAGRPO family or IAC/MAAC)
trains the agents on it for `num_train_epochs`, starting from the round's weights with fresh
optimizers. With `preference_scoring_reward: reward_model` the previous round's reward model
scores the candidates (round 1 uses the task reward). Evaluation always uses the task reward.

A round is the unit of resume: its artifacts are keyed by the chain of round checkpoints

    round_r = H(round_{r-1}, round r, items, sampling, comparator, selection, replay, training settings)

so a rerun skips every completed round and continues from the last one, and a scheduled run with
`max_new_rounds=1` runs exactly the next round of the experiment.
"""

import random
from collections.abc import Callable

from coopflow.artifacts import ArtifactRef, key_for
from coopflow.stages.agents.checkpoint import CheckpointLayout
from coopflow.stages.agents.models import load_policies, save_checkpoint
from coopflow.stages.agents.spec import specs_for
from coopflow.stages.agents.state import Policies
from coopflow.stages.common.seeds import derive_seed
from coopflow.stages.evaluate.evaluate import evaluate
from coopflow.stages.evaluate.reward_drift import drift_metrics, drift_record
from coopflow.stages.planning.context import (RunContext, formatters_for, joint_prompt_parts, processed_range,
                                  resolve_model_sources)
from coopflow.stages.planning.keys import rm_round_key, round_keys
from coopflow.stages.loops.run import run_segments
from coopflow.stages.loops.segment import acquire_policies, open_checkpoint
from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts
from coopflow.stages.score.pairs import aligned_comparisons
from coopflow.stages.score.replay import sample_replay
from coopflow.stages.score.scores import score_rewards


def completed_rounds(ctx: RunContext) -> int:
    """How many rounds of this experiment are already stored (their checkpoints)."""
    n = 0
    for key in round_keys(ctx):
        if ctx.store.find("checkpoint", key) is None:
            break
        n += 1
    return n


def _sampling(ctx: RunContext, p: int) -> SamplingConfig:
    """The rounds' sampling with p samples per prompt."""
    return SamplingConfig.of(ctx.settings.round, ctx.settings.execution, p)


def _comparator(ctx: RunContext, r: int, keys: list[str], target):
    """(comparator policies, whether they are the target's own models) for round r."""
    from coopflow.stages.agents.workers import agent_devices

    t, a = ctx.settings.round.trainer, ctx.settings.round.agents
    devices = agent_devices(ctx.settings.execution.trainer.comparator_devices, ctx.n, a.device)

    def frozen(dirs) -> Policies:  # comparator agent i from dirs[i] on comparator device i
        return load_policies(specs_for(dirs, t.agent_learning_rate, a.dtype, a.attn_implementation, devices))

    if t.comparator_policy == "current" or (t.comparator_policy == "current_copy" and set(devices) == {a.device}):
        return target, True  # (current_copy on the agents' own devices uses the agents, as the reference)
    if t.comparator_policy == "current_copy":  # a frozen copy of this round's starting policy on other devices
        prev = ctx.store.find("checkpoint", keys[r - 2]) if r > 1 else None
        dirs = CheckpointLayout(ctx.store.open_dir(prev)).sources(ctx.n)[0] if prev is not None else ctx.sources
        return frozen(dirs), False
    if t.comparator_policy == "history":
        k = t.comparator_history_k or 1
        for back in range(r - k, 0, -1):  # round r-k, else the newest earlier one, else the initial agents
            ref = ctx.store.find("checkpoint", keys[back - 1])
            if ref is not None:
                return frozen(CheckpointLayout(ctx.store.open_dir(ref)).sources(ctx.n)[0]), False
        return frozen(ctx.sources), False
    srcs = t.comparator_agents or [t.comparator_model_name] * ctx.n
    paths, _ = resolve_model_sources(srcs, ctx.settings, ctx.store, "trainer.comparator_model_name")
    return frozen(paths), False


def api_rows(ctx: RunContext, prompts: list[list[str]], n: int) -> list[dict]:
    """Comparator candidates from the HTTP comparator, as rollout-like rows (texts only)."""
    api = _api(ctx)
    t = ctx.settings.round.trainer
    rows = []
    for j, item in enumerate(ctx.train_items):
        for a in range(ctx.n):
            texts = api.complete(prompts[a][j], n, a, t.max_new_tokens, t.temperature, t.top_p, t.top_k, item)
            for s, text in enumerate(texts):
                rows.append({"step": 0, "item_id": item["_item_id"], "turn": 0, "node_id": j, "agent": a, "sample": s,
                             "prompt": prompts[a][j], "prompt_ids": [], "completion_ids": [], "completion_text": text,
                             "length": 0, "finished": True, "ref_kl": 0.0, "parent_node": -1, "parent_joint": -1})
    return rows


def _api(ctx: RunContext):
    """The run's HTTP comparator client."""
    from coopflow.stages.rollout.comparator_api import APIComparator

    t, x = ctx.settings.round.trainer, ctx.settings.execution.trainer  # what is asked; credentials and limits
    return APIComparator(t.comparator_api_url, t.comparator_api_format, t.comparator_api_model, x.comparator_api_timeout,
                         t.comparator_api_headers or {}, x.comparator_api_key, x.comparator_api_key_env,
                         t.comparator_api_key_header, t.comparator_api_key_prefix, t.comparator_api_extra_body or {},
                         t.comparator_api_response_field, t.comparator_api_max_n_per_request,
                         x.comparator_api_retries)


def coordinated_rows(ctx: RunContext, comp, n: int, seed: int) -> list[dict]:
    """Comparator rows written by a centralized coordinator (comparator_generation_mode centralized or
    centralized_sequential, decentralized agents): comparator agent comparator_centralized_agent_index, or the
    API comparator, writes every role."""
    from coopflow.stages.rollout.coordinator import coordinator_rows
    from coopflow.stages.tasks.centralized import load_adapter

    rs = ctx.settings.round
    t = rs.trainer
    idx = t.comparator_centralized_agent_index
    adapter = load_adapter(rs.centralized_adapter, rs.centralized_adapter_kwargs)
    roles, wrap = joint_prompt_parts(rs, ctx.roles, comp.tokenizers[idx] if comp is not None else None)
    api = None
    if comp is None:
        client = _api(ctx)

        def api(prompt: str, k: int, item: dict) -> list[str]:
            return client.complete(prompt, k, idx, t.max_new_tokens, t.temperature, t.top_p, t.top_k, item)
    return coordinator_rows(ctx.train_items, roles, adapter, t.comparator_generation_mode, n, _sampling(ctx, n), seed,
                            comp, idx, wrap, api)


def _reward_lists(scores: list[dict]) -> dict[int, list[float]]:
    out: dict[int, dict[int, float]] = {}
    for s in scores:
        out.setdefault(s["item_id"], {})[s["joint_idx"]] = s["reward"]
    return {i: [v[j] for j in range(len(v))] for i, v in out.items()}


def round_pairs(ctx: RunContext, r: int, target_rows, target_scores, comp_rows, comp_scores, same_models: bool,
                tokenizers) -> tuple[list[dict], list[tuple[int, int]]]:
    """This round's shard: index-aligned target-vs-comparator pairs (schema `pairs`), and the selected
    (item, candidate index) of every pair. Comparator completions from other models are re-tokenized."""
    rs = ctx.settings.round
    t = rs.trainer
    tr, cr = _reward_lists(target_scores), _reward_lists(comp_scores)
    trow = {(x["item_id"], x["agent"], x["sample"]): x for x in target_rows}
    crow = {(x["item_id"], x["agent"], x["sample"]): x for x in comp_rows}
    out, pid, selected = [], 0, []
    for item_id in sorted(tr):
        everything = tr[item_id] + cr[item_id]
        mean = sum(everything) / len(everything)
        rng = random.Random(derive_seed(rs.seed, "round-pairs", r, item_id))
        for idx, target_wins in aligned_comparisons(tr[item_id], cr[item_id], t.pair_selection,
                                                    t.preference_pairs_per_sample, rng):
            selected.append((item_id, idx))
            wr, lr = (tr, cr) if target_wins else (cr, tr)
            for a in range(ctx.n):
                tx, cx = trow[(item_id, a, idx)], crow[(item_id, a, idx)]
                c_ids = cx["completion_ids"] if same_models else \
                    tokenizers[a](cx["completion_text"], add_special_tokens=False)["input_ids"]
                w, l = (tx, cx) if target_wins else (cx, tx)
                w_ids, l_ids = (tx["completion_ids"], c_ids) if target_wins else (c_ids, tx["completion_ids"])
                out.append({"pair_id": pid, "item_id": item_id, "agent": a, "winner": idx, "loser": idx,
                            "winner_reward": wr[item_id][idx], "loser_reward": lr[item_id][idx],
                            "candidate_reward_mean": mean, "prompt": tx["prompt"], "chosen": w["completion_text"],
                            "rejected": l["completion_text"], "prompt_ids": tx["prompt_ids"], "chosen_ids": w_ids,
                            "rejected_ids": l_ids})
            pid += 1
    return out, selected


def run_round(ctx: RunContext, r: int, show_progress: bool = False) -> dict:
    """Run round r (1-based) from round r-1's checkpoint; returns refs, this round's metrics and its
    warnings (`cached` when the round was already stored)."""
    from coopflow.stages.update.dpo import dpo_update

    store, rs = ctx.store, ctx.settings.round
    t = rs.trainer
    keys = round_keys(ctx)
    key = keys[r - 1]
    found = [store.find(k, key) for k in ("checkpoint", "metrics", "pairs")]
    if all(found):
        return {"checkpoint": found[0], "metrics": found[1], "shard": found[2], "cached": True, "warnings": []}
    prev = store.find("checkpoint", keys[r - 2]) if r > 1 else None
    if r > 1 and prev is None:
        raise ValueError(f"round {r - 1} is not stored: run the rounds in order")
    # env_step continues over the rounds (the x-axis of every round metric): DPO counts
    # environment_steps_per_pair per trained pair, MARLHF-iter the joint actions its RL phase scored
    env = CheckpointLayout(store.open_dir(prev)).trainer_state().get("env_step", 0) if prev is not None else 0
    pol = _round_start(ctx, prev, keys[r - 2] if r > 1 else ctx.plan.start_key)
    fmts = formatters_for(ctx, pol, rs)
    ids = [it["_item_id"] for it in ctx.train_items]
    by_id = {it["_item_id"]: it for it in ctx.train_items}
    prompts = [[f(it) for it in ctx.train_items] for f in fmts]
    P = t.preference_num_candidates
    try:
        # --- generate -> compare
        target_rows = generate_rollouts(pol, prompts, ids, _sampling(ctx, P), derive_seed(rs.seed, "target", r), 0)
        Pc, cseed = t.comparator_num_candidates or P, derive_seed(rs.seed, "comparator", r)  # an independent stream
        # a coordinator writes every role (decentralized agents; a centralized run's comparator is its one model)
        coordinated = ctx.adapter is None and t.comparator_generation_mode != "decentralized"
        if t.comparator_policy == "api":
            comp_rows = coordinated_rows(ctx, None, Pc, cseed) if coordinated else api_rows(ctx, prompts, Pc)
            same = False
        else:
            comp, same = _comparator(ctx, r, keys, pol)
            if coordinated:
                comp_rows, same = coordinated_rows(ctx, comp, Pc, cseed), False
            else:
                comp_rows = generate_rollouts(comp, prompts, ids, _sampling(ctx, Pc), cseed, 0)
            if comp is not pol:
                comp.close()
        ctx.session.calls["generate"] += 2
        caller, processor, warnings = _scoring_reward(ctx, r, keys)
        target_scores = score_rewards(target_rows, by_id, caller, processor, "aligned", 0)
        comp_scores = score_rewards(comp_rows, by_id, caller, processor, "aligned", 0)
        shard_rows, selected = round_pairs(ctx, r, target_rows, target_scores, comp_rows, comp_scores, same,
                                           pol.tokenizers)
        shard = store.find("pairs", key) or store.put_table("pairs", key, shard_rows)
        # --- replay: training pairs from this and earlier rounds' shards
        shards = []
        for k in keys[:r - 1]:
            ref = store.find("pairs", k)
            rows = store.read_rows(ref) if ref is not None else []
            shards.append(_group(rows))
        shards.append(_group(shard_rows))
        train = sample_replay(shards, t.preference_replay_mode, t.preference_replay_k, t.preference_replay_lambda,
                              t.preference_replay_sample_size, random.Random(derive_seed(rs.seed, "replay", r)))
        metrics = {"iter/current_iteration": float(r), "iter/current_preference_pairs": float(len(shards[-1])),
                   "iter/total_preference_pairs": float(sum(len(s) for s in shards)),
                   "iter/train_preference_pairs": float(len(train))}
        rl_metrics: list[ArtifactRef] = []
        if rs.algorithm == "marlhf-iter":  # --- a fresh reward model on the training pairs, then RL on it
            pol, m, rl_metrics, rl_warnings, rl_env = _rlhf_phase(ctx, r, keys, prev, pol, train, show_progress)
            env += rl_env
            metrics.update(m)
            warnings += [w for w in rl_warnings if w not in warnings]
        else:  # --- DPO on the training pairs
            rng = random.Random(derive_seed(rs.seed, "dpo-shuffle", r))
            for _ in range(t.num_train_epochs if train else 0):
                rng.shuffle(train)
                for b in range(0, len(train), t.batch_size):
                    chunk = train[b:b + t.batch_size]
                    m = dpo_update(pol, {a: [p[a] for p in chunk] for a in range(ctx.n)}, t.dpo_beta)
                    if t.use_environment_step:
                        env += t.environment_steps_per_pair * len(chunk)
                    ctx.session.calls["update"] += 1
            if train:
                metrics.update({k: v for k, v in m.items() if not k.startswith("agent_")})
        reward_range = processed_range(ctx.caller.fn, rs.reward.reward_range, ctx.processor)
        drift = None
        if t.log_reward_distribution:
            if reward_range is None:
                raise ValueError("log_reward_distribution needs a reward range: set reward.reward_range")
            raw_t = {(s["item_id"], s["joint_idx"]): s["reward_raw"] for s in target_scores}
            raw_c = {(s["item_id"], s["joint_idx"]): s["reward_raw"] for s in comp_scores}
            drift = drift_record(r, reward_range[0], reward_range[1], list(raw_t.values()), list(raw_c.values()),
                                 [raw_t[x] for x in selected], [raw_c[x] for x in selected])
            metrics.update(drift_metrics(drift))
            store.put_json("drift", key, drift)
    except BaseException:
        ctx.session.live.clear()
        raise
    # --- evaluate (task reward) and checkpoint this round
    ev_rows, ev = evaluate(pol, ctx.eval_items_used(), fmts, _sampling(ctx, t.num_generations), ctx.caller,
                           ctx.processor, derive_seed(rs.seed, "round-eval", r), ctx.episode, ctx.eval_hooks,
                           samples=t.eval_samples_per_item)
    ctx.session.calls["evaluate"] += 1
    metrics.update(ev)
    # the evaluated answers, for `coopflow show --eval` of this round (named after the checkpoint written next)
    store.put_table("eval", key, ev_rows, meta={"checkpoint": key})
    state = {"round": r, "env_step": env, "algorithm": rs.algorithm}
    pol.state = state
    ckpt = store.put_dir("checkpoint", key, lambda d: save_checkpoint(pol, d, state))
    ctx.session.live.put(key, pol)
    rows = [{"key": k, "value": v, "env_step": env} for k, v in metrics.items()]
    return {"checkpoint": ckpt, "metrics": store.put_table("metrics", key, rows), "shard": shard, "cached": False,
            "drift": drift, "rl_metrics": rl_metrics, "warnings": warnings}


def _round_start(ctx: RunContext, prev: ArtifactRef | None, start_key: str):
    """The policies a round starts from. MARLHF-iter rounds keep weights only: its RL phase builds fresh
    optimizers (and critics) each round, so a checkpoint's optimizer state is not carried over."""
    if ctx.algorithm != "marlhf-iter" or prev is None:
        return acquire_policies(ctx, prev, start_key, ctx.settings.round)
    pol = ctx.session.live.take(start_key)
    if pol is not None:
        return pol
    ctx.session.live.clear()
    return open_checkpoint(ctx, prev, with_optimizers=False, settings=ctx.settings.round)


# --- MARLHF-iter: reward model per round ---------------------------------------------------------


def _scoring_reward(ctx: RunContext, r: int, keys: list[str]):
    """(caller, processor, warnings) that score round r's candidates: the task reward, or with
    preference_scoring_reward 'reward_model' the previous round's reward model (raw = processed)."""
    from coopflow.stages.score.rewards import RewardCaller, resolve_processor
    from coopflow.stages.loops.preference import load_rm_reward

    if ctx.settings.round.trainer.preference_scoring_reward != "reward_model" or r == 1:
        return ctx.caller, ctx.processor, []  # round 1 has no reward model yet: the task reward
    ref = ctx.store.find("reward_model", rm_round_key(keys[r - 2]))
    if ref is None:
        return ctx.caller, ctx.processor, [f"round {r}: round {r - 1} fitted no reward model (no training pairs); "
                                           "scoring with the task reward"]
    return RewardCaller(load_rm_reward(ctx, ref), ctx.n), resolve_processor(None), []


def _rlhf_phase(ctx: RunContext, r: int, keys: list[str], prev: ArtifactRef | None, pol, train: list[dict],
                show_progress: bool = False):
    """Fit a fresh joint reward model on the training pairs and run the RL backend on it from the round's
    starting weights (fresh optimizers, as the reference builds a new RL trainer per round).
    Returns (policies after RL, metrics, RL metrics refs, warnings, env steps of the RL phase)."""
    from coopflow.stages.loops import preference as P

    store, key = ctx.store, keys[r - 1]
    if not train:
        return pol, {}, [], [f"round {r}: no training pairs; the policy is unchanged this round"], 0
    rows = [{**x, "pair_id": i} for i, rec in enumerate(train) for x in rec.values()]
    train_ref = store.put_table("pairs", key_for("pairs", {"round_train": key}), rows)
    rm_ref, m = P.fit_rm(ctx, train_ref, rm_round_key(key))
    start = keys[r - 2] if r > 1 else ctx.plan.start_key
    sources = ctx.sources if prev is None else [str(p) for p in CheckpointLayout(store.open_dir(prev)).sources(ctx.n)[0]]
    pol.close()
    ctx.session.live.clear()
    rctx = P.rl_context(ctx, rm_ref, sources, {"round_start": start})
    res = run_segments(rctx, show_progress=show_progress)
    first, last = res.first_last()
    m.update({"rl/rm_reward_first": first, "rl/rm_reward_last": last, "rl/updates": float(len(rctx.plan.updates))})
    pol = acquire_policies(rctx, res.checkpoint, res.checkpoint.key)
    return (pol, {k2: v for k2, v in m.items() if v is not None}, res.metrics_refs, list(rctx.plan.warnings),
            res.env_steps)


def round_eval(store, metrics: ArtifactRef) -> dict[str, float]:
    """The task-reward evaluation (`eval/...`) stored in a round's metrics table."""
    return {r["key"]: r["value"] for r in store.read_rows(metrics) if r["key"].startswith("eval/")}


def _group(rows: list[dict]) -> list[dict]:
    """Pair rows (one per agent) -> one record per pair: {agent: row}."""
    out: dict[int, dict[int, dict]] = {}
    for x in rows:
        out.setdefault(x["pair_id"], {})[x["agent"]] = x
    return [out[k] for k in sorted(out)]


RoundRunner = Callable[[RunContext, int], dict]


def run_rounds(ctx: RunContext, max_new_rounds: int | None = None, run_new_round: RoundRunner | None = None,
               on_round: Callable[[int, dict], None] | None = None, show_progress: bool = False) -> list[dict]:
    """The round loop: every round of the experiment in order, stored ones read back, at most
    `max_new_rounds` new ones (a scheduled run passes 1). `run_new_round(ctx, r)` runs a round that is
    not stored (default `run_round`; a flow passes its round subflow); `on_round(r, result)` is called
    after each newly run round. A round stored meanwhile by an overlapping run of the same experiment (it held
    the round's lock) counts as stored, not new: this run then goes on to the round after it."""
    keys = round_keys(ctx)
    out, new = [], 0
    for r in range(1, len(keys) + 1):
        stored = ctx.store.find("checkpoint", keys[r - 1]) is not None
        if not stored and max_new_rounds is not None and new >= max_new_rounds:
            break
        if stored:
            res = run_round(ctx, r, show_progress)  # read back
        else:  # one process computes a round: an overlapping run of the experiment waits, then reads it back
            with ctx.store.lock(f"round-{keys[r - 1]}", [keys[r - 1]]):
                done = ctx.store.find("checkpoint", keys[r - 1]) is not None
                res = run_round(ctx, r, show_progress) if done or run_new_round is None else run_new_round(ctx, r)
        if not res["cached"]:
            new += 1
            if on_round is not None:
                on_round(r, res)
        export_round(ctx, r, res)
        out.append(res)
    return out


def export_round(ctx: RunContext, r: int, res: dict) -> None:
    """Copies of round r where the config asks for them: its pairs as `preference_replay_dir/iteration_XXXX.json`
    and its policy as `policy_checkpoint_dir/iteration_XXXX/agent_i` (the initial one as `initial/agent_i`). Each
    file or agent dir is written atomically, so one that exists is complete: a rerun's stored rounds are skipped."""
    from pathlib import Path

    from coopflow.artifacts.export import export_json, export_tree

    t = ctx.settings.execution.trainer  # (copies outside the store)
    shard_file = Path(t.preference_replay_dir) / f"iteration_{r:04d}.json" if t.preference_replay_dir else None
    if shard_file is not None and not shard_file.exists():
        pairs: dict[int, dict] = {}
        for row in sorted(ctx.store.read_rows(res["shard"]), key=lambda x: (x["pair_id"], x["agent"])):
            p = pairs.setdefault(row["pair_id"], {"item_id": row["item_id"], "winner_reward": row["winner_reward"],
                                                  "loser_reward": row["loser_reward"], "prompts": [], "chosen": [],
                                                  "rejected": []})
            p["prompts"].append(row["prompt"])
            p["chosen"].append(row["chosen"])
            p["rejected"].append(row["rejected"])
        export_json(shard_file, {"iteration": r, "num_pairs": len(pairs), "pairs": list(pairs.values())})
    if not t.policy_checkpoint_dir:
        return
    root = Path(t.policy_checkpoint_dir)
    if r == 1:
        for i, src in enumerate(ctx.sources):
            if Path(src).is_dir() and not (root / "initial" / f"agent_{i}").exists():
                export_tree(src, root / "initial" / f"agent_{i}")
    todo = [i for i in range(ctx.n) if not (root / f"iteration_{r:04d}" / f"agent_{i}").exists()]
    if todo:
        lay = CheckpointLayout(ctx.store.open_dir(res["checkpoint"]))
        for i in todo:
            export_tree(lay.agent(i), root / f"iteration_{r:04d}" / f"agent_{i}")
