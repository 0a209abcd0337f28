"""The rest of the reference's public API: centralized trainers, utils, models, schedulers, 1.4.3 defaults."""

from types import SimpleNamespace

import pytest
import torch

from coopflow.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig
from coopflow.trainers.preference import (CentralizedCollaboration, CentralizedComparatorParseError, MADPOConfig,
                                          MADPOIterConfig, MADPOIterTrainer, MADPOTrainer,
                                          TaggedCentralizedComparatorAdapter)
from coopflow.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, MAGRPOConfig
from coopflow.utils import (RewardProcessors, call_reward_function, normalize_reward_lengths, reference_kl_for_sequence,
                            resolve_reference_devices, resolve_reward_range, set_reward_range)

GOOD = "<agent_0> good </agent_0> <agent_1> good </agent_1>"
BAD = "<agent_0> bad </agent_0> <agent_1> bad </agent_1>"


@pytest.fixture
def word_tokenizer():
    """A word-level tokenizer whose role tags are ordinary tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "joint", "left", "right", "good", "bad", "<agent_0>", "</agent_0>",
             "<agent_1>", "</agent_1>"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def gpt2(tok, seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))


class JointPrompt(TaggedCentralizedComparatorAdapter):
    def build_prompt(self, item, agent_prompts):
        assert agent_prompts == ["left", "right"]
        return "joint left right"


def both_good(left, right, *, batch_items, prompts):
    assert prompts == ["left"]  # role 0's prompt, as the reference passes it
    return [float(a == "good") + float(b == "good") for a, b in zip(left, right)]


set_reward_range(both_good, 0, 2)


def scripted(model, tok, texts):
    """Replace model.generate by one that writes `texts` in turn (the reference's generate call shape)."""
    calls = []

    def generate(*, input_ids, num_return_sequences, **kwargs):
        calls.append(tok.decode(input_ids[0]))
        out = []
        for r in range(input_ids.shape[0]):
            for k in range(num_return_sequences):
                ids = torch.tensor(tok.encode(texts[(len(calls) + k) % len(texts)]))
                out.append(torch.cat([input_ids[r], ids]))
        return SimpleNamespace(sequences=torch.stack(out))

    model.generate = generate
    return calls


def _dataset():
    from datasets import Dataset

    return Dataset.from_list([{"id": "task", "prompt": "task prompt"}])


# --- centralized trainers -------------------------------------------------------------------------------


def test_centralized_magrpo_trains_its_one_actor_in_place(word_tokenizer, tmp_path):
    model = gpt2(word_tokenizer)
    calls = scripted(model, word_tokenizer, [GOOD, BAD])
    args = CentralizedMAGRPOConfig(num_agents=2, num_train_epochs=1, num_generations=2, eval_interval=0,
                                   rollout_buffer_size=1, max_new_tokens=8, agent_learning_rate=1e-3)
    trainer = CentralizedMAGRPOTrainer(agents=[model], num_agents=2, tokenizer=word_tokenizer, args=args,
                                       train_dataset=_dataset(), eval_dataset=_dataset(), reward_func=both_good,
                                       formatters=[lambda _: "left", lambda _: "right"],
                                       centralized_adapter=JointPrompt(), data_dir=str(tmp_path))
    assert len(trainer.agents) == len(trainer.optimizers) == trainer.num_agents == 1 and trainer.args.num_agents == 2
    assert trainer.reward_func.reward_range == (0.0, 2.0)
    before = model.transformer.wte.weight.detach().clone()
    out = trainer.train(show_progress=False)
    assert calls and set(calls) == {"joint left right"}  # the user's model generated, from the joint prompt
    assert trainer.env_step == out["env_steps"] == 2  # 1 item x 2 joint responses
    assert not torch.equal(before, model.transformer.wte.weight)  # trained in place
    seen = []
    trainer.eval_logger = lambda **kw: seen.append(kw) or [{}]
    trainer.eval_aggregator = lambda detailed, **kw: {"turn_1/seen": 1.0}
    scripted(model, word_tokenizer, [GOOD])
    metrics = trainer.evaluate(num_eval_samples=1)
    assert seen[0]["agent_completions_turns"] == [[["good"]], [["good"]]]  # the logger sees the two roles
    assert metrics["eval/turn_1/reward_mean"] == 2.0 and metrics["eval/turn_1/seen"] == 1.0


def test_centralized_config_and_constructor_errors(word_tokenizer):
    assert CentralizedMAGRPOConfig().num_turns == 1 and MAGRPOConfig().num_turns == 2
    with pytest.raises(ValueError, match="centralized collaboration"):
        CentralizedMAGRPOConfig(collaboration_mode="decentralized")
    with pytest.raises(ValueError, match="num_turns=1"):
        CentralizedMAGRPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="exactly one actor"):  # checked before anything else, as the reference
        CentralizedMAGRPOTrainer(agents=[gpt2(word_tokenizer), gpt2(word_tokenizer)],
                                 args=CentralizedMAGRPOConfig())
    with pytest.raises(ValueError, match="exactly one actor"):
        MADPOTrainer(agents=[gpt2(word_tokenizer)] * 2, args=MADPOConfig(collaboration_mode="centralized"))
    with pytest.raises(ValueError, match="actor index 0"):
        MADPOIterConfig(collaboration_mode="centralized", comparator_centralized_agent_index=1)
    c = MADPOIterConfig(collaboration_mode="centralized")
    assert (c.num_agents, c.comparator_generation_mode) == (2, "centralized")
    assert MADPOIterConfig(num_agents=3, comparator_generation_mode="centralised",
                           comparator_centralized_agent_index=2).comparator_generation_mode == "centralized"


def test_centralized_iterative_trainer_counts_env_steps_and_exports(word_tokenizer, tmp_path):
    """Two rounds of one pair each: env_step 2 per round (environment_steps_per_pair); the replay shards and
    the round policies are exported where the reference writes them."""
    model = gpt2(word_tokenizer)
    scripted(model, word_tokenizer, [GOOD, BAD])
    args = MADPOIterConfig(collaboration_mode="centralized", num_agents=2, num_iterations=2, num_train_epochs=1,
                           preference_num_candidates=2, preference_pairs_per_sample=1, eval_interval=0,
                           max_new_tokens=8, agent_learning_rate=1e-3, preference_replay_dir=str(tmp_path / "replay"),
                           policy_checkpoint_dir=str(tmp_path / "ckpt"))
    trainer = MADPOIterTrainer(agents=[model], num_agents=2, tokenizer=word_tokenizer, args=args,
                               train_dataset=_dataset(), eval_dataset=_dataset(), reward_func=both_good,
                               formatters=[lambda _: "left", lambda _: "right"],
                               centralized_comparator_adapter=JointPrompt(), data_dir=str(tmp_path / "data"))
    trainer.train(show_progress=False)
    assert trainer.env_step == 4
    import json

    shard = json.loads((tmp_path / "replay" / "iteration_0002.json").read_text())
    assert shard["iteration"] == 2 and shard["num_pairs"] == len(shard["pairs"]) >= 0
    for it in ("initial", "iteration_0001", "iteration_0002"):
        assert (tmp_path / "ckpt" / it / "agent_0" / "config.json").is_file(), it
    assert not (tmp_path / "ckpt" / "iteration_0001" / "agent_1").exists()


def test_collaboration_splits_rewards_and_metric_samples():
    collab = CentralizedCollaboration(JointPrompt(), [lambda _: "left", lambda _: "right"], both_good, 2)
    item = {"id": "task"}
    assert collab([GOOD, "no sections"], batch_items=[item, item]) == [2.0, 0.0]  # a parse failure scores ""
    assert collab.reward_range == (0.0, 2.0) and collab.build_prompt(item) == "joint left right"
    original = SimpleNamespace(agent_idx=0, completion=GOOD, metadata={"batch_item": item})
    got = collab.wrap_metrics_callback(lambda samples: samples)([original])
    assert [(s.agent_idx, s.completion) for s in got] == [(0, "good"), (1, "good")]
    assert original.completion == GOOD and all(s.metadata is original.metadata for s in got)
    with pytest.raises(CentralizedComparatorParseError):
        TaggedCentralizedComparatorAdapter().parse_completion("plain", {}, 2)


# --- 1.4.3 defaults and checks ----------------------------------------------------------------------------


def test_reference_defaults_and_derived_values():
    assert IACConfig().discount == MAACConfig().discount == 1.0  # 1.4.3 (the spec's 0.9 is older)
    assert MAGRPOConfig().num_agents == 2
    assert MAGRPOConfig(rollout_buffer_size=3).train_batch_size == 3
    assert IACConfig(critic_learning_rate=None, agent_learning_rate=1e-3).critic_learning_rate == 1e-3
    assert IACConfig(critic_type="Q").critic_type == "q"
    with pytest.raises(ValueError, match=r"reference_devices length \(3\) must be 1 or 2"):
        MAGRPOConfig(num_agents=2, reference_kl_enabled=True, reference_devices=["cpu"] * 3)
    assert MADPOIterConfig().preference_replay_dir is None and MADPOIterConfig().policy_checkpoint_dir is None


def test_iac_builds_args_num_agents_agents(tiny_model_dir):
    t = IACTrainer(agent_model=str(tiny_model_dir), reward_func=lambda *a: [0.0],
                   args=IACConfig(num_agents=3, num_turns=1, use_separate_critic=False))
    assert t.num_agents == 3 and len(t.agents) == 3
    assert t.env_step == 0 and t.verbose and t.device == torch.device("cpu")
    assert t.agent_devices == [torch.device("cpu")] * 3 and t.model_name == str(tiny_model_dir)


# --- utils ------------------------------------------------------------------------------------------------


def test_reward_utils():
    def r(a, b):
        return [len(x) + len(y) for x, y in zip(a, b)]

    assert call_reward_function(r, ["p"], [["ab"], ["c"]], num_agents=2) == [3.0]
    assert resolve_reward_range(r) is None
    assert resolve_reward_range(set_reward_range(r, minimum=0, maximum=5)) == (0.0, 5.0)
    assert normalize_reward_lengths([1.0], num_agents=3, num_generations=1, algorithm="IAC") == [1.0] * 3
    assert normalize_reward_lengths([1.0, 2.0], num_agents=2, num_generations=1, algorithm="IAC") == [1.0, 2.0]
    with pytest.raises(ValueError, match="either 1 or 2 values"):
        normalize_reward_lengths([1.0, 2.0, 3.0], num_agents=2, num_generations=2, algorithm="IAC")
    assert RewardProcessors.scale()(3.0) == 3.0 and RewardProcessors.shift(0.5)(1.0) == 1.5
    assert RewardProcessors.shift().spec == "shift:0.0"


def test_reference_kl_helpers(word_tokenizer):
    a, b = gpt2(word_tokenizer, 0), gpt2(word_tokenizer, 1)
    seq = torch.tensor([[3, 4, 6, 7, 1]])
    mask = torch.ones_like(seq)
    assert torch.allclose(reference_kl_for_sequence(a, a, seq, mask, prompt_len=2, response_len=3), torch.zeros(1))
    assert reference_kl_for_sequence(a, b, seq, mask, prompt_len=2, response_len=3).item() > 0
    args = SimpleNamespace(reference_devices=None)
    assert resolve_reference_devices(args, [torch.device("cpu")], expected_count=2) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="reference_devices length"):
        resolve_reference_devices(SimpleNamespace(reference_devices=["cpu"] * 3), [], expected_count=2)


def test_models_and_schedulers(word_tokenizer):
    from coopflow.models import CausalLMWithValueHead
    from coopflow.schedulers import DeviceScheduler, normalize_parallel_training

    m = CausalLMWithValueHead(gpt2(word_tokenizer), value_head_hidden_dim=8)
    out = m(input_ids=torch.tensor([[3, 4, 5]]))
    assert out.logits.shape == (1, 3, len(word_tokenizer)) and out.values.shape == (1, 3)
    assert CausalLMWithValueHead(gpt2(word_tokenizer), attach_value_head=False)(
        input_ids=torch.tensor([[3]])).values is None
    assert DeviceScheduler.resolve_devices("cpu", 2) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match=r"length \(2\) must be 1 or 3"):
        DeviceScheduler.resolve_devices(["cpu", "cpu"], 3)
    assert normalize_parallel_training(None) == "none" and normalize_parallel_training("MP") == "mp"
    with pytest.raises(ValueError):
        normalize_parallel_training("auto")


def test_live_agents_start_only_a_context_with_their_sources(tmp_path):
    """A session's live agents stand in for exactly the sources they were loaded from: a context starting from
    other weights (e.g. a later round's checkpoint) loads those instead."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import validate_config
    from coopflow.stages.agents.state import Policies
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.loops.segment import acquire_policies
    from coopflow.stages.planning.session import Session
    from coopflow.stages.tasks.taskset import build_taskset
    from tests.conftest import small_config

    cfg = validate_config(small_config(tmp_path))
    store = ArtifactStore(tmp_path / "artifacts")
    live = Policies([])
    ctx = make_context(cfg, store, build_taskset(cfg.taskset, store), session=Session(initial=live))
    ctx.session.initial_sources = tuple(ctx.sources)
    assert acquire_policies(ctx, None, ctx.plan.start_key) is live
    ctx.session.initial_sources = ("some/other/checkpoint",)
    other = acquire_policies(ctx, None, ctx.plan.start_key)
    assert other is not live and other.n == 2
