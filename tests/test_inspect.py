"""A run's joint answers, read back from the store: `coopflow.rollouts`, `coopflow show`, `coopflow export`.

One tiny two-epoch run; the joined table must agree with the stored scores and advantages row by row, the commands
must read the store only (no model loads) and refuse an unknown run in one line naming the runs there are.
"""

import pytest

import coopflow
from coopflow.artifacts import ArtifactStore
from coopflow.flows.cli import main
from coopflow.schemas.config import validate_config
from coopflow.stages.operations import rollouts as R
from tests.conftest import small_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from coopflow.flows.driver import run_inline

    tmp = tmp_path_factory.mktemp("inspect")
    cfg = validate_config(small_config(tmp, trainer={"num_train_epochs": 2}))
    out = run_inline(cfg)
    return tmp, out, ArtifactStore.at(tmp)


def test_the_joined_table_agrees_with_the_stored_scores_and_advantages(finished):
    data, out, store = finished
    df = coopflow.rollouts(data_dir=str(data))
    assert list(df.columns) == list(R.COLUMNS) and set(df["run_key"]) == {out["run_key"]}
    info = R.find_run(store)
    steps = R.update_manifest(store, info)
    assert sorted(set(df["update"])) == [s["update"] for s in steps] and len(steps) == info.updates
    for step in steps:
        scores = store.read_rows(store.find("scores", step["scores"]))
        adv = {(a["turn"], a["node_id"], a["agent"], a["sample"]): a["advantage"]
               for a in store.read_rows(store.find("advantages", step["signal"]))}
        mine = df[df["update"] == step["update"]]
        assert len(mine) == len(scores) * 2  # one row per agent of every joint action
        for s in scores:
            rows = mine[(mine["node_id"] == s["node_id"]) & (mine["joint"] == s["joint_idx"])]
            assert list(rows["agent"]) == [0, 1] and set(rows["reward"]) == {s["reward"]}
            for _, r in rows.iterrows():
                assert r["sample"] == s["combo"][r["agent"]]
                assert r["advantage"] == adv[(r["turn"], r["node_id"], r["agent"], r["sample"])]
        rollouts = {(x["node_id"], x["agent"], x["sample"]): x["completion_text"]
                    for x in store.read_rows(store.find("rollouts", step["rollouts"]))}
        assert all(rollouts[(r["node_id"], r["agent"], r["sample"])] == r["completion"] for _, r in mine.iterrows())
    first, last = coopflow.rollouts(data_dir=str(data), updates="first"), coopflow.rollouts(data_dir=str(data),
                                                                                              updates="last")
    assert set(first["update"]) == {steps[0]["update"]} and set(last["update"]) == {steps[-1]["update"]}
    ev = coopflow.rollouts(out["run_key"][:8], data_dir=str(data), eval=True)
    assert list(ev.columns) == list(R.EVAL_COLUMNS) and len(ev) > 0
    assert abs(ev.groupby(["item_id", "sample"])["reward"].first().mean() - out["eval"]["eval/turn_1/reward_mean"]) \
        < 1e-9


def test_show_prints_joint_answers_from_the_store_without_loading_a_model(finished, capsys, monkeypatch):
    import transformers

    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    data, out, store = finished
    assert main(["show", "--data-dir", str(data), "--sort", "-reward", "--limit", "3"]) == 0
    text = capsys.readouterr().out
    assert out["run_key"] in text and "advantage" in text
    df = coopflow.rollouts(data_dir=str(data), updates="last")
    shown = [float(line.split("reward ")[1].split(" ")[0]) for line in text.splitlines() if line.startswith("update ")]
    assert len(shown) == 3 and shown[0] == pytest.approx(df["reward"].max(), abs=1e-4) and shown == sorted(shown,
                                                                                                         reverse=True)
    item = int(coopflow.rollouts(data_dir=str(data), updates="first")["item_id"].iloc[0])
    assert main(["show", "--data-dir", str(data), "--item", str(item), "--update", "first"]) == 0
    text = capsys.readouterr().out
    assert all(f"item {item} " in line for line in text.splitlines() if line.startswith("update "))
    assert main(["show", "--data-dir", str(data), "--compare", "--item", str(item)]) == 0
    text = capsys.readouterr().out
    assert f"item {item}: update" in text
    assert [line.count("agent 0 ·") for line in text.splitlines() if line.startswith("agent 0")] == [2]  # side by side
    assert main(["show", "--data-dir", str(data), "--eval"]) == 0
    assert "eval · item" in capsys.readouterr().out


def test_export_writes_one_loadable_table(finished, tmp_path):
    import datasets
    import pandas as pd

    data, out, store = finished
    assert main(["export", out["run_key"], "--data-dir", str(data), "--out", str(tmp_path / "r.parquet")]) == 0
    df = pd.read_parquet(tmp_path / "r.parquet")
    assert df.equals(coopflow.rollouts(out["run_key"], data_dir=str(data)))
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "r.parquet"), cache_dir=str(tmp_path / "c"))
    assert ds["train"].num_rows == len(df) and ds["train"].column_names == list(R.COLUMNS)
    assert main(["export", out["run_key"][:10], "--data-dir", str(data), "--out", str(tmp_path / "ds")]) == 0
    assert datasets.load_from_disk(str(tmp_path / "ds")).num_rows == len(df)


def test_an_unknown_run_is_refused_in_one_line_naming_the_runs(finished, capsys, tmp_path):
    data, out, store = finished
    assert main(["show", "nosuchrun", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nosuchrun" in err and out["run_key"][:12] in err
    assert main(["export", "nosuchrun", "--data-dir", str(data), "--out", str(tmp_path / "x.parquet")]) == 2
    assert not (tmp_path / "x.parquet").exists() and "nosuchrun" in capsys.readouterr().err
    assert main(["show", "--data-dir", str(tmp_path / "empty")]) == 2
    assert "no training run" in capsys.readouterr().err


def test_mlflow_gets_the_selected_updates_and_every_evaluation_as_tables(tmp_path):
    """tracking.rollouts 2 of a 4-update run with a periodic evaluation: tables of updates 0, 2 and the last (3),
    the periodic evaluation's answers (stored beside the segment's metrics), and the final and before evaluations."""
    import json

    from mlflow.tracking import MlflowClient

    from coopflow.flows.driver import run_inline

    cfg = validate_config(small_config(tmp_path, trainer={"num_train_epochs": 2, "eval_interval": 2},
                                       tracking={"rollouts": 2}, eval_before=True))
    out = run_inline(cfg, tracking=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(out["mlflow_run_id"])
    tables = [t["path"] for t in json.loads(run.data.tags["mlflow.loggedArtifacts"])]
    periodic = sorted(p for p in tables if "eval_update_" in p)
    assert "rollouts/eval.json" in tables and "rollouts/eval_before.json" in tables and periodic
    segs = [p for p in tables if "segment_" in p]
    logged = set()
    for p in segs:
        t = json.loads(open(client.download_artifacts(run.info.run_id, p, str(tmp_path / "dl"))).read())
        logged |= {row[t["columns"].index("update")] for row in t["data"]}
    assert logged == {0, 2, 3}
    t = json.loads(open(client.download_artifacts(run.info.run_id, periodic[0], str(tmp_path / "dl"))).read())
    assert t["columns"][:4] == ["item_id", "sample", "reward", "agent_0"] and len(t["data"]) == 2  # eval_num_samples


def _preference(tmp, algorithm: str, **trainer) -> dict:
    from coopflow.flows.driver import run_inline

    cfg = small_config(tmp)
    cfg["trainer"] = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4,
                      "eval_num_samples": 2, **trainer}
    return run_inline(validate_config(cfg, algorithm))


def test_a_madpo_run_shows_its_pairs_chosen_and_rejected(tmp_path, capsys):
    out = _preference(tmp_path, "madpo", preference_pairs_per_sample=2, train_batch_size=2, eval_interval=0)
    store = ArtifactStore.at(tmp_path)
    info = R.find_run(store)
    assert info.preference and info.key == out["run_key"]
    pairs = store.read_rows(store.find("pairs", R.update_manifest(store, info)[0]["signal"]))
    df = coopflow.rollouts(data_dir=str(tmp_path))
    assert len(df) == 2 * len(pairs) and set(df["joint"]) == {0, 1}  # each pair: chosen and rejected, per agent
    assert df["update"].nunique() == 1  # the DPO updates all draw from the same pairs: listed once
    for p in pairs:
        mine = df[(df["node_id"] == p["pair_id"]) & (df["agent"] == p["agent"])].set_index("joint")
        assert mine.loc[0, "completion"] == p["chosen"] and mine.loc[0, "reward"] == p["winner_reward"]
        assert mine.loc[1, "completion"] == p["rejected"] and mine.loc[1, "reward"] == p["loser_reward"]
    assert main(["show", "--data-dir", str(tmp_path), "--limit", "2"]) == 0
    text = capsys.readouterr().out
    assert "a preference run" in text and "joint 0" in text and "joint 1" in text
    assert main(["show", "--data-dir", str(tmp_path), "--eval"]) == 0  # its final evaluation, as for any run


def test_an_iterative_round_shows_that_rounds_pairs(tmp_path):
    _preference(tmp_path, "madpo-iter", num_iterations=2, temperature=1.0)
    store = ArtifactStore.at(tmp_path)
    rounds = R.runs(store)
    assert len(rounds) == 2 and all(r.preference for r in rounds)
    for r in rounds:
        shard = store.read_rows(store.find("pairs", r.key))
        rows = R.joint_rows(store, r)
        assert len(rows) == 2 * len(shard) and {x["completion"] for x in rows if x["joint"] == 0} == \
            {p["chosen"] for p in shard}
        ev = R.eval_rows(store, r)  # each round's evaluation, as the round's metrics summarize it
        metrics = {m["key"]: m["value"] for m in store.read_rows(store.find("metrics", r.key))}
        assert ev and abs(sum(x["reward"] for x in ev if x["agent"] == 0) / len({(x["item_id"], x["sample"])
                                                                               for x in ev})
                          - metrics["eval/turn_1/reward_mean"]) < 1e-9


def test_a_multi_turn_runs_rows_link_each_turn_to_the_joint_action_it_continues(tmp_path):
    from coopflow.flows.driver import run_inline

    cfg = small_config(tmp_path, trainer={**small_config(tmp_path)["trainer"], "num_turns": 2,
                                          "joint_mode": "aligned", "rollout_buffer_size": 3,
                                          "early_termination_threshold": None},
                       transition={"name": "plain"})
    run_inline(validate_config(cfg))
    df = coopflow.rollouts(data_dir=str(tmp_path))
    first, second = df[df["turn"] == 0], df[df["turn"] == 1]
    assert len(second) and (first["parent_node"] == -1).all() and (second["parent_node"] >= 0).all()
    joints = set(zip(first["node_id"], first["joint"]))
    assert set(zip(second["parent_node"], second["parent_joint"])) <= joints  # every turn-2 node continues one


def test_mlflow_gets_a_preference_runs_pairs_and_each_rounds_pairs_and_evaluation(tmp_path):
    import json

    from mlflow.tracking import MlflowClient

    from coopflow.flows.driver import run_inline

    def tables(client, run) -> dict:
        paths = [t["path"] for t in json.loads(run.data.tags.get("mlflow.loggedArtifacts", "[]"))]
        return {p: json.loads(open(client.download_artifacts(run.info.run_id, p, str(tmp_path / "dl"))).read())
                for p in paths}

    base = {"num_train_epochs": 1, "max_new_tokens": 8, "preference_num_candidates": 4, "eval_num_samples": 2}
    cfg = small_config(tmp_path / "madpo")
    cfg["trainer"] = {**base, "preference_pairs_per_sample": 2, "train_batch_size": 2, "eval_interval": 0}
    out = run_inline(validate_config(cfg, "madpo"), tracking=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'madpo' / 'mlflow.db'}")
    got = tables(client, client.get_run(out["mlflow_run_id"]))
    store = ArtifactStore.at(tmp_path / "madpo")
    pairs = R.joint_rows(store, R.find_run(store))
    assert len(got["rollouts/pairs.json"]["data"]) == len(pairs) // 2  # one row per joint action, agents side by side
    assert "rollouts/eval.json" in got

    cfg = small_config(tmp_path / "iter")
    cfg["trainer"] = {**base, "num_iterations": 2, "temperature": 1.0}
    run_inline(validate_config(cfg, "madpo-iter"), tracking=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'iter' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("coopflow")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("coopflow.round")]
    assert len(children) == 2
    for child in children:
        got = tables(client, child)
        assert {"rollouts/pairs.json", "rollouts/eval.json"} <= set(got) and got["rollouts/eval.json"]["data"]
