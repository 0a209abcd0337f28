"""Pre-flight budget: hand-computed counts, the refusal message, the unreachable-turn warning."""

import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import validate_config
from coopflow.stages.planning.budget import BudgetExceeded, check, estimate, unreachable_turns_warning
from coopflow.stages.tasks.taskset import build_taskset
from coopflow.stages.planning.session import Session
from coopflow.stages.planning.context import make_context
from tests.conftest import small_config


def test_single_turn_aligned_counts():
    b = estimate(n_items=16, n_eval_items=4, num_agents=2, k=4, num_turns=1, joint_mode="aligned", epochs=2, buffer=1)
    assert (b.updates, b.generate_calls, b.sequences, b.joint_actions, b.reward_calls, b.eval_sequences) == \
        (32, 64, 16 * 2 * 4 * 2, 16 * 2 * 4, 16 * 2 * 4, 8)


def test_cross_and_tree_counts():
    b = estimate(n_items=1, n_eval_items=0, num_agents=2, k=3, num_turns=1, joint_mode="cross", epochs=1, buffer=1)
    assert b.joint_actions == 9 and b.sequences == 6
    # 2 turns, cross: 1 root + 9 children nodes; each node 3 samples x 2 agents, 9 joint actions
    b = estimate(n_items=1, n_eval_items=0, num_agents=2, k=3, num_turns=2, joint_mode="cross", epochs=1, buffer=1)
    assert b.joint_actions == 10 * 9 and b.sequences == 10 * 6 and b.generate_calls == 4
    # aligned trees: K^t nodes at depth t -> 1 + 4 + 16 nodes for 3 turns
    b = estimate(n_items=1, n_eval_items=0, num_agents=2, k=4, num_turns=3, joint_mode="aligned", epochs=1, buffer=1)
    assert b.joint_actions == 21 * 4


def test_over_budget_refused_before_any_model_loads(tmp_path):
    cfg = validate_config(small_config(tmp_path, max_sequences=10))
    store = ArtifactStore(tmp_path / "artifacts")
    session = Session()
    with pytest.raises(BudgetExceeded, match=r"16 sequences .* above max_sequences=10"):
        make_context(cfg, store, build_taskset(cfg.taskset, store), sources=["unused"], source_ident={},
                     session=session)
    assert session.executed() == {} and session.live.policies is None
    with pytest.raises(BudgetExceeded):
        check(estimate(10, 0, 2, 2, 1, "aligned", 1, 1), 5)
    check(estimate(10, 0, 2, 2, 1, "aligned", 1, 1), 0)  # 0 = no limit


def test_unreachable_second_turn_warning():
    msg = unreachable_turns_warning(2, -0.2, (0.0, 1.0))
    assert msg and "ever reaches turn 2" in msg
    assert unreachable_turns_warning(2, 0.5, (0.0, 1.0)) is None
    assert unreachable_turns_warning(2, None, (0.0, 1.0)) is None
    assert unreachable_turns_warning(1, -0.2, (0.0, 1.0)) is None
