"""The coopflow extensions learn on the tiny model, over seeds: Dr. MAS and REINFORCE++ normalization, clipped
multi-epoch updates (token ratio, GSPO's sequence ratio) and AT-GRPO's greedy trees. Each runs the setting of
`test_training.test_learning_moves_length_ratio_reward` (MAGRPO: +0.24 … +0.52 over seeds 0-4) or, for AT-GRPO,
the shipped multi-turn config, with only the method's settings changed."""

import pytest

from tests.conftest import small_config
from tests.helpers import LEARNING_SEEDS, assert_learns

SINGLE_TURN = {
    "dr-mas": {"advantage_normalization_scope": "agent"},
    "reinforce++": {"advantage_normalization_scope": "batch"},
    "clipped-2-epochs": {"num_policy_epochs": 2, "clip_range": 0.2},
    "gspo-2-epochs": {"num_policy_epochs": 2, "clip_range": 0.2, "ratio_level": "sequence"},
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(SINGLE_TURN))
def test_single_turn_extension_learns(tmp_path, method):
    from coopflow.schemas.config import validate_config
    from coopflow.flows.driver import run_inline

    gains = []
    for seed in LEARNING_SEEDS:
        d = tmp_path / f"seed{seed}"
        cfg = validate_config(small_config(
            d, seed=seed, taskset={"name": "story-length-ratio", "num_items": 16, "num_eval_items": 4},
            trainer={**small_config(d)["trainer"], "num_train_epochs": 2, "num_generations": 4, "max_new_tokens": 32,
                     "rollout_buffer_size": 1, **SINGLE_TURN[method]}))
        s = run_inline(cfg)
        gains.append(s["reward_last"] - s["reward_first"])
    assert_learns(gains, 0.15)


@pytest.mark.slow
def test_at_grpo_multiturn_learns(tmp_path):
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    gains = []
    for seed in LEARNING_SEEDS:
        cfg = load_config("configs/at-grpo-multiturn.yaml", [f"data_dir={tmp_path / str(seed)}", f"seed={seed}"],
                          algorithm="magrpo")
        s = run_inline(cfg)
        gains.append(s["reward_last"] - s["reward_first"])
    assert_learns(gains, 0.15)
