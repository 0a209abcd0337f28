"""Stage: comparator candidates written by a centralized coordinator (iterative preference rounds).

With decentralized agents, a round's comparator normally has one model per agent. With
`comparator_generation_mode: centralized` one comparator model (agent `comparator_centralized_agent_index`)
is the coordinator: it reads the adapter's joint prompt built from the N role prompts and writes P_c joint
completions (one batched generate over all items), each split by the adapter into the N role outputs.
With `centralized_sequential` the roles are written in order: for role i, one completion per candidate
from `build_sequential_prompt(item, role prompts, i, that candidate's earlier role outputs)` (one batched
generate per role over all items × candidates), parsed by `parse_sequential_completion`. An API
comparator gets the same prompts over HTTP.

The result has the shape of decentralized comparator rows (per item, agent, sample; texts only), so the
pairing, replay and DPO steps do not know who wrote them; their token ids are re-tokenized by each agent.
"""

from collections.abc import Callable

from coopflow.stages.agents.state import OneAgent
from coopflow.stages.rollout.generate import SamplingConfig, generate_rollouts
from coopflow.stages.tasks.centralized import check_adapter, split_roles


def _row(item: dict, node: int, agent: int, sample: int, prompt: str, text: str) -> dict:
    return {"step": 0, "item_id": item["_item_id"], "turn": 0, "node_id": node, "agent": agent, "sample": sample,
            "prompt": prompt, "prompt_ids": [], "completion_ids": [], "completion_text": text, "length": 0,
            "finished": True, "ref_kl": 0.0, "parent_node": -1, "parent_joint": -1}


def coordinator_rows(items: list[dict], role_formatters: list[Callable[[dict], str]], adapter, mode: str,
                     k: int, sampling: SamplingConfig, seed: int, comparator=None, index: int = 0,
                     wrap: Callable[[str], str] | None = None, api=None) -> list[dict]:
    """Comparator rows (per item × role × candidate) written centrally; `comparator` = the comparator's policy
    group (its agent `index` writes), or `api(prompt, n, item) -> [text]` for an HTTP comparator."""
    n = len(role_formatters)
    check_adapter(adapter, type(adapter).__name__, sequential=mode == "centralized_sequential")
    wrap = wrap or (lambda s: s)
    role_prompts = [[f(it) for f in role_formatters] for it in items]
    texts = [[[""] * n for _ in range(k)] for _ in items]  # [item][candidate][role]

    def sample(prompts: list[str], per: int, salt: int) -> list[list[str]]:  # [prompt][sample] texts
        if api is not None:
            of = items if per == k else [items[p // k] for p in range(len(prompts))]
            return [api(p, per, it) for p, it in zip(prompts, of)]
        rows = generate_rollouts(OneAgent(comparator, index), [prompts], list(range(len(prompts))),
                                 sampling.with_k(per), seed + salt, 0)
        out = [[""] * per for _ in prompts]
        for r in rows:
            out[r["node_id"]][r["sample"]] = r["completion_text"]
        return out

    if mode == "centralized":
        joint = [wrap(adapter.build_prompt(it, rp)) for it, rp in zip(items, role_prompts)]
        for j, outs in enumerate(sample(joint, k, 0)):
            for s, text in enumerate(outs):
                texts[j][s] = split_roles(adapter, text, items[j], n)[0]
    elif mode == "centralized_sequential":
        for i in range(n):
            prompts = [wrap(adapter.build_sequential_prompt(items[j], role_prompts[j], i, texts[j][s][:i]))
                       for j in range(len(items)) for s in range(k)]
            outs = sample(prompts, 1, 1 + i)
            for p, o in enumerate(outs):
                j, s = divmod(p, k)
                texts[j][s][i] = str(adapter.parse_sequential_completion(o[0], items[j], i))
    else:
        raise ValueError(f"unknown centralized comparator mode {mode!r}")
    return [_row(it, j, a, s, role_prompts[j][a], texts[j][s][a])
            for j, it in enumerate(items) for a in range(n) for s in range(k)]
