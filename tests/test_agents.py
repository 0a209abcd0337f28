"""Agent set-ups through the same stages: heterogeneous models/tokenizers, single agent (GRPO), cross mode."""

import json

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.agents.models import build_tiny_model
from coopflow.flows.driver import run_inline
from tests.conftest import small_config


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    a = build_tiny_model(tmp_path_factory.mktemp("model-a"), hidden_size=64, num_layers=2, vocab_size=384)
    b = build_tiny_model(tmp_path_factory.mktemp("model-b"), hidden_size=32, num_layers=3, vocab_size=300, seed=1)
    return a, b


def test_heterogeneous_agents_with_own_tokenizers_and_formatters(tmp_path, two_models):
    a, b = two_models
    cfg = validate_config(small_config(tmp_path, agents={"agent_model": None, "agents": [str(a), str(b)]},
                                       formatters=[{"template": "Briefly: {prompt}"}, {"template": "At length: {prompt}"}]))
    s = run_inline(cfg)
    ck = json.loads((__import__("pathlib").Path(s["checkpoint"]) / "agent_1" / "config.json").read_text())
    assert ck["hidden_size"] == 32 and ck["num_hidden_layers"] == 3
    store = ArtifactStore(tmp_path / "artifacts")
    rows = [r for d in (tmp_path / "artifacts" / "rollouts").iterdir() if not d.name.startswith(".")
            for r in store.read_rows(store.find("rollouts", d.name))]
    p0 = next(r for r in rows if r["agent"] == 0 and r["item_id"] == 0)
    p1 = next(r for r in rows if r["agent"] == 1 and r["item_id"] == 0)
    assert p0["prompt"] == "Briefly: write a story about a robot" and p1["prompt"].startswith("At length: ")
    assert p0["prompt_ids"] != p1["prompt_ids"]  # each agent tokenizes with its own tokenizer
    assert max(max(r["completion_ids"]) for r in rows if r["agent"] == 1) < 300


def test_single_agent_is_grpo(tmp_path):
    cfg = validate_config(small_config(tmp_path, agents={"agent_model": "tiny", "num_agents": 1},
                                       reward={"name": "tests.helpers:near_forty_chars"}))
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 2  # items x K
    assert (__import__("pathlib").Path(s["checkpoint"]) / "agent_0").is_dir()
    assert not (__import__("pathlib").Path(s["checkpoint"]) / "agent_1").exists()


def test_cross_mode_scores_k_to_the_n_joint_actions(tmp_path):
    trainer = {**small_config(tmp_path)["trainer"], "joint_mode": "crossed", "num_generations": 3}
    cfg = validate_config(small_config(tmp_path, trainer=trainer))
    s = run_inline(cfg)
    assert s["env_steps"] == 4 * 3 ** 2


class _Payload:
    """A pickle that would write a file when unpickled (a crafted checkpoint)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_crafted_pickle_in_a_checkpoint_is_refused(tmp_path):
    import torch

    from coopflow.stages.agents.models import load_tensors

    bad = tmp_path / "optimizer.pt"
    hit = tmp_path / "pwned"
    torch.save({"state": {}, "param_groups": [], "x": _Payload(str(hit))}, bad)
    with pytest.raises(ValueError, match="optimizer.pt holds objects other than tensors"):
        load_tensors(bad)
    assert not hit.exists()
    good = tmp_path / "ok.pt"
    torch.save({"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 0.1}]}, good)
    assert load_tensors(good)["param_groups"][0]["lr"] == 0.1


def test_prompts_beyond_the_context_are_refused_or_truncated(tiny_model_dir, caplog):
    from coopflow.stages.agents.models import load_agent
    from coopflow.stages.rollout.generate import SamplingConfig, generate_for_agent

    model, tok = load_agent(str(tiny_model_dir))
    context = model.config.max_position_embeddings
    long = "write a story about the sea " * (context // 2)
    assert len(tok(long)["input_ids"]) > context
    strict = SamplingConfig(1, 8, 1.0, 1.0, 50)
    with pytest.raises(ValueError, match=r"leave no room for max_new_tokens 8 in the model's context of \d+ tokens"):
        generate_for_agent(model, tok, ["short one", long], 1, strict, seed=0)
    lenient = SamplingConfig(1, 8, 1.0, 1.0, 50, prompt_overflow="truncate")
    with caplog.at_level("WARNING", logger="coopflow.generate"):
        rows = generate_for_agent(model, tok, ["short one", long], 1, lenient, seed=0)
    assert len(rows[1][0]) == context - 8 and "cut to their last" in caplog.text


def test_a_saved_tokenizer_does_not_depend_on_whether_its_last_call_padded(tmp_path, tiny_model_dir):
    """transformers leaves the padding of a padded call set on the fast tokenizer's backend; a checkpoint's
    tokenizer.json must not record it (a resumed run and a clean one write the same bytes), and saving must not
    change the live tokenizer."""
    from coopflow.stages.agents.models import load_agent, save_tokenizer

    _, tok = load_agent(tiny_model_dir)
    tok(["a b c", "a"], padding=True)
    padded = tok.backend_tokenizer.padding
    assert padded is not None  # the state this test is about
    save_tokenizer(tok, tmp_path / "after_padded")
    assert tok.backend_tokenizer.padding == padded
    tok(["a b c"])
    assert tok.backend_tokenizer.padding is None
    save_tokenizer(tok, tmp_path / "after_plain")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "after_padded" / name).read_bytes() == (tmp_path / "after_plain" / name).read_bytes()
    assert json.loads((tmp_path / "after_padded" / "tokenizer.json").read_text())["padding"] is None
