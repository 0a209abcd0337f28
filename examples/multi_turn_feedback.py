"""Multi-turn MAGRPO: two agents answer, get feedback on their joint answer, and answer again (the seed's
multi-turn tutorial). The external transition is called per branch of the rollout tree with that
branch's histories and returns each agent's next prompt.

    python examples/multi_turn_feedback.py
"""

import os

from datasets import Dataset

from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from coopflow.utils.reward_utils import set_reward_range

QUICK = os.environ.get("COOPFLOW_EXAMPLE_QUICK") == "1"


def ratio_reward(completions1, completions2):
    """How close len(agent 2) / len(agent 1) is to 2.5 (1.0 exactly there, 0 far away)."""
    out = []
    for c1, c2 in zip(completions1, completions2):
        ratio = len(c2) / max(1, len(c1))
        out.append(max(0.0, 1.0 - abs(ratio - 2.5) / 2.5))
    return out


set_reward_range(ratio_reward, 0.0, 1.0)


def feedback_transition(*, prompt, agent_completions, num_agents, prompt_history_per_agent,
                        response_history_per_agent):
    """Tell each agent how the lengths compare and what to change."""
    a, b = (len(c) for c in agent_completions)
    ratio = b / max(1, a)
    hint = "good, keep it" if 2 <= ratio <= 3 else ("agent 2 should write more" if ratio < 2 else
                                                     "agent 2 should write less")
    return [f"{prompt}\nYour story had {n} characters; the ratio was {ratio:.1f} ({hint}). Rewrite it."
            for n in (a, b)]


if __name__ == "__main__":
    topics = ["a robot", "the ocean", "a dragon", "the moon"]
    train = Dataset.from_dict({"prompt": [f"write a story about {t}" for t in topics[:2 if QUICK else 4]]})
    args = MAGRPOConfig(
        num_turns=2, early_termination_threshold=None,  # the reference's -0.2 would never reach turn 2 here
        num_train_epochs=1, agent_learning_rate=1e-3, num_generations=2, max_new_tokens=8 if QUICK else 24,
        temperature=1.0, top_p=1.0, top_k=50, rollout_buffer_size=1, eval_interval=0, eval_num_samples=2)
    trainer = MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=ratio_reward, train_dataset=train,
                            external_transition=feedback_transition, args=args)
    summary = trainer.train()
    print(f"eval {summary['eval']}")
