"""Flows under one session-scoped Prefect test server: smoke, cached rerun, stage reruns, MLflow."""

import json

import pytest

from coopflow.schemas.config import ConfigError
from tests.conftest import small_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def first_run(prefect_harness, tmp_path_factory):
    from coopflow.flows.train import train_magrpo

    tmp = tmp_path_factory.mktemp("flow")
    cfg = small_config(tmp)
    summary = train_magrpo(config=cfg)
    return cfg, summary, summary["executed"]


def test_flow_smoke_and_mlflow(first_run):
    from mlflow.tracking import MlflowClient

    cfg, s, executed = first_run
    assert executed["generate"] == 2 and executed["update"] == 2 and executed["evaluate"] == 2  # before + after
    assert s["env_steps"] == 8 and set(s["eval"]) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    assert (__import__("pathlib").Path(s["checkpoint"]) / "agent_1" / "model.safetensors").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db")
    run = client.get_run(s["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    # MLflow's writes ran on a writer thread; the flow returned only after all of them, and the thread is gone
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("mlflow-writer")]
    assert run.data.params["trainer.num_generations"] == "2"
    hist = client.get_metric_history(run.info.run_id, "turn_1/reward_mean")
    assert [m.step for m in hist] == [4, 8]
    assert "eval/turn_1/reward_mean" in run.data.metrics and "timing/generate_s" in run.data.metrics
    assert "eval_before/turn_1/reward_mean" in run.data.metrics and s["eval_before"].keys() == s["eval"].keys()
    assert "reward" in s["seconds"] and "generate" in s["seconds"]
    assert run.data.tags["lineage.checkpoint.final"].startswith("checkpoint/")
    assert run.data.tags["lineage.taskset"].startswith("taskset/")
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"rollouts", "lineage.json", "summary.json"} <= names
    # the joint answers as tables the UI shows: both updates (every 10th and the last), the evaluations
    tables = [t["path"] for t in json.loads(run.data.tags["mlflow.loggedArtifacts"])]
    assert tables == ["rollouts/eval_before.json", "rollouts/segment_0001.json", "rollouts/eval.json"]
    seg = json.loads(open(client.download_artifacts(run.info.run_id, tables[1], str(cfg["data_dir"]))).read())
    assert seg["columns"][:5] == ["update", "item_id", "reward", "agent_0", "agent_1"]
    assert sorted({r[0] for r in seg["data"]}) == [0, 1] and "agent_1" in seg["columns"]
    # run artifacts live under the data dir, not in ./mlruns of the working directory
    art = __import__("pathlib").Path(cfg["data_dir"]) / "mlartifacts"
    assert run.info.artifact_uri.startswith(art.as_uri())
    assert (art / "coopflow" / run.info.run_id / "artifacts" / "summary.json").is_file()


def test_cached_second_run_executes_no_stage(first_run):
    from coopflow.flows.train import train_magrpo

    cfg, s, _ = first_run
    again = train_magrpo(config=cfg)
    assert again["executed"] == {} and again["run_key"] == s["run_key"]
    assert again["eval"] == s["eval"] and again["reward_last"] == s["reward_last"]


def test_mareinforce_flow_differs_only_in_advantage(first_run, tmp_path):
    from coopflow.flows.train import train_mareinforce

    cfg, s, _ = first_run
    out = train_mareinforce(config={**cfg, "data_dir": str(tmp_path)})
    assert out["algorithm"] == "mareinforce" and out["run_key"] != s["run_key"]


def test_rerun_evaluate_only(first_run):
    from coopflow.flows.train import train_magrpo

    cfg, s, _ = first_run
    out = train_magrpo(config=cfg, stages=["evaluate"], refresh=["evaluate"])
    assert out["executed"] == {"evaluate": 1}
    assert out["eval"] == s["eval"]  # seeded sampling: same checkpoint, same evaluation


def test_rescore_stored_rollouts_with_changed_reward(first_run):
    from coopflow.flows.train import train_magrpo

    cfg, s, _ = first_run
    changed = {**cfg, "reward": {"name": "tests.helpers:loose_length_ratio"}}
    out = train_magrpo(config=changed, stages=["score"], rescore_from=s["run_key"])
    assert out["executed"] == {"score": 2}  # two updates re-scored, nothing generated or trained
    assert out["rescore"]["updates"] == 2


def test_invalid_config_fails_before_any_model_loads(prefect_harness, tmp_path):
    from coopflow.flows.train import train_magrpo

    bad = small_config(tmp_path, trainer={**small_config(tmp_path)["trainer"], "num_generations": 1})
    with pytest.raises(ConfigError, match="trainer.num_generations"):
        train_magrpo(config=bad)
    assert not (tmp_path / "artifacts").exists()


def test_continue_training_into_the_same_mlflow_run(prefect_harness, tmp_path):
    """1 epoch, then continue to 3 epochs: same MLflow run, env_step continues, equals an uninterrupted run."""
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import train_magrpo
    from tests.test_training import _weights

    one = small_config(tmp_path / "a")
    three = {**one, "trainer": {**one["trainer"], "num_train_epochs": 3}}
    first = train_magrpo(config=one)
    cont = train_magrpo(config=three, continue_run=first["mlflow_run_id"])
    assert cont["executed"].get("generate") == 4  # epochs 2 and 3 only (2 updates each)
    assert cont["mlflow_run_id"] == first["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{one['data_dir']}/mlflow.db")
    hist = client.get_metric_history(first["mlflow_run_id"], "turn_1/reward_mean")
    assert [m.step for m in hist] == [4, 8, 12, 16, 20, 24]
    run = client.get_run(first["mlflow_run_id"])
    assert run.data.tags["coopflow.run_key"] == cont["run_key"]
    assert run.data.tags["continued.trainer.num_train_epochs"] == "1 -> 3"
    straight = train_magrpo(config={**three, "data_dir": str(tmp_path / "b")})
    assert straight["run_key"] == cont["run_key"]
    wa, wb = _weights(__import__("pathlib").Path(cont["checkpoint"])), _weights(
        __import__("pathlib").Path(straight["checkpoint"]))
    for k in wa:
        assert __import__("torch").allclose(wa[k], wb[k], atol=1e-6), k
    with pytest.raises(ConfigError, match="not a segment of this config"):
        train_magrpo(config={**three, "seed": 5}, continue_run=first["mlflow_run_id"])


def test_multi_turn_flow_logs_per_turn_metrics_and_the_early_termination_warning(prefect_harness, tmp_path):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import train_magrpo

    cfg = small_config(tmp_path, transition={"name": "feedback"})
    cfg["trainer"] = {**cfg["trainer"], "num_turns": 2, "early_termination_threshold": -0.2}
    s = train_magrpo(config=cfg)  # the reference default: every branch stops after turn 1, with a warning
    assert s["env_steps"] == 4 * 2 and "no branch ever reaches turn 2" in s["warnings"][0]
    assert set(s["eval"]) >= {"eval/turn_2/reward_mean", "eval/turn_1/expected_return"}
    s = train_magrpo(config=cfg, overrides={"trainer.early_termination_threshold": None})
    assert s["env_steps"] == 4 * (2 + 2 * 2) and s["warnings"] == []
    client = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db")
    hist = client.get_metric_history(s["mlflow_run_id"], "turn_2/expected_return")
    assert [m.step for m in hist] == [6, 12, 18, 24]  # one 3-node tree fills a buffer of 2: one item per update


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_actor_critic_flows_log_the_reference_metric_names(prefect_harness, tmp_path, algo):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import FLOWS

    cfg = small_config(tmp_path, critic={"critic_model": "tiny"})
    cfg["trainer"] = {"num_train_epochs": 1, "num_turns": 1, "max_new_tokens": 8, "rollout_buffer_size": 2,
                      "eval_interval": 0, "eval_num_samples": 2, "agent_learning_rate": 1e-3}
    s = FLOWS[f"train-{algo}"](config=cfg)
    assert s["env_steps"] == 4  # K=1: one joint sample per item
    run = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db").get_run(s["mlflow_run_id"])
    names = set(run.data.metrics)
    assert {"turn_1/reward_mean", "turn_1/expected_return", "turn_1/policy_loss", "turn_1/value_loss",
            "turn_1/value_pred_mean", "turn_1/value_target_mean", "turn_1/explained_variance",
            "eval/turn_1/reward_mean"} <= names
    if algo == "maac":
        assert "turn_1/epoch_reward_mean" in names and "turn_1/epoch_value_loss" in names
    assert run.data.params["algorithm"] == algo and run.data.params["critic.critic_model"] == "tiny"
    again = FLOWS[f"train-{algo}"](config=cfg, stages=["critic"])  # re-fit the critic(s) from stored samples
    assert again["executed"] == {"fit_critic": 1} and "critic_refit/value_loss_after" in again["critic_refit"]


@pytest.mark.parametrize("algo", ["madpo", "marlhf"])
def test_preference_flows_track_pairs_and_rerun_only_downstream(prefect_harness, tmp_path, algo):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import FLOWS

    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_train_epochs": 1, "agent_learning_rate": 1e-3, "max_new_tokens": 8, "temperature": 1.0,
                      "preference_num_candidates": 4, "preference_pairs_per_sample": 2, "train_batch_size": 2,
                      "eval_interval": 0, "eval_num_samples": 2, "logging_steps": 1}
    if algo == "marlhf":
        cfg["trainer"].update(num_generations=2, rollout_buffer_size=2)
    s = FLOWS[f"train-{algo}"](config=cfg)
    assert s["executed"]["generate"] >= 1 and s["pair_count"] >= 1 and "eval/turn_1/reward_mean" in s["eval"]
    run = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db").get_run(s["mlflow_run_id"])
    names = set(run.data.metrics)
    if algo == "madpo":
        assert {"rewards/margins", "rewards/accuracies", "turn_1/reward_mean", "dpo/loss"} <= names
        over = {"trainer.dpo_beta": 0.2}
    else:
        assert {"reward_model/accuracy", "reward_model/margin", "turn_1/reward_mean"} <= names
        over = {"trainer.reward_learning_rate": 3e-5}
    assert run.data.tags["lineage.pairs"].startswith("pairs/")
    again = FLOWS[f"train-{algo}"](config=cfg, overrides=over)
    assert "pairs" not in again["executed"]  # candidates, scores and pairs come from the store
    if algo == "madpo":
        assert "generate" not in again["executed"] and "score" not in again["executed"]
    else:  # the RL phase scores with the new reward model; only its second update generates anew
        assert again["executed"]["fit_reward_model"] == 1 and again["executed"]["generate"] == 1


def test_madpo_iter_flow_one_round_per_run_into_one_parent_mlflow_run(prefect_harness, tmp_path):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import train_madpo_iter

    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_iterations": 3, "agent_learning_rate": 1e-3, "max_new_tokens": 8, "temperature": 1.0,
                      "preference_num_candidates": 4, "train_batch_size": 4, "eval_num_samples": 2,
                      "log_reward_distribution": True}
    a = train_madpo_iter(config=cfg, max_new_rounds=1)
    b = train_madpo_iter(config=cfg, max_new_rounds=1)  # as a scheduled deployment run would
    assert (a["ran_rounds"], b["ran_rounds"]) == ([1], [2]) and b["completed_rounds"] == 2
    assert a["mlflow_run_id"] == b["mlflow_run_id"]  # every round of one experiment under one parent run
    client = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db")
    parent = client.get_run(a["mlflow_run_id"])
    kids = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(k.data.tags["coopflow.round"] for k in kids) == ["1", "2"]
    # round metrics are logged at env_step, which continues over rounds: 2 env steps per trained pair (1 epoch)
    pairs = [m.value for m in client.get_metric_history(parent.info.run_id, "iter/train_preference_pairs")]
    steps = [m.step for m in client.get_metric_history(parent.info.run_id, "iter/current_iteration")]
    assert steps == [2 * pairs[0], 2 * (pairs[0] + pairs[1])] and steps[1] > steps[0] > 0
    files = {f.path for f in client.list_artifacts(kids[0].info.run_id, "reward_distributions")}
    assert any(f.endswith(".json") for f in files) and any(f.endswith(".html") for f in files)


def test_marlhf_iter_flow_logs_each_rounds_rl_metrics_in_its_child_run(prefect_harness, tmp_path):
    from mlflow.tracking import MlflowClient

    from coopflow.flows.train import train_marlhf_iter

    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_iterations": 2, "agent_learning_rate": 1e-3, "max_new_tokens": 8, "temperature": 1.0,
                      "preference_num_candidates": 4, "num_generations": 2, "num_train_epochs": 1,
                      "rollout_buffer_size": 2, "reward_num_train_epochs": 1, "reward_train_batch_size": 4,
                      "eval_num_samples": 2}
    a = train_marlhf_iter(config=cfg, max_new_rounds=1)
    assert a["algorithm"] == "marlhf-iter" and a["ran_rounds"] == [1] and "eval/turn_1/reward_mean" in a["eval"]
    client = MlflowClient(tracking_uri=f"sqlite:///{cfg['data_dir']}/mlflow.db")
    parent = client.get_run(a["mlflow_run_id"])
    assert parent.data.tags["coopflow.algorithm"] == "marlhf-iter"
    kid = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")[0]
    assert {"reward_model/accuracy", "turn_1/reward_mean", "rl/rm_reward_last"} <= set(kid.data.metrics)
