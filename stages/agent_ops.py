"""Per-agent operations: what a policy container (in-process or a worker process) can run on one agent.

Each op takes the agent's `AgentState` first, then plain picklable arguments, and returns plain
picklable results, so the same op runs in this process or in the agent's worker process.
"""

from stages.generate_rollouts import generate_for_agent
from stages.models import AgentState, save_agent
from stages.update_actor_critic import agent_values, update_actor
from stages.update_dpo import dpo_deltas, dpo_step
from stages.update_policies import update_agent


def _generate(agent: AgentState, prompts: list[str], k: int, sampling, seed: int) -> list[tuple]:
    return generate_for_agent(agent.model, agent.tokenizer, prompts, k, sampling, seed, agent.reference)


OPS = {"generate": _generate, "update": update_agent, "save": save_agent, "ac_values": agent_values,
       "ac_update": update_actor, "dpo_deltas": dpo_deltas, "dpo_step": dpo_step}
