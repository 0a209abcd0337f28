"""The pipeline's stages: plain typed functions over artifact refs (no Prefect, no MLflow, no module state).

One folder per phase, in pipeline order:

    tasks/    build the taskset; per-agent prompt formatters; transitions between turns
    rollout/  sample the agents' completions (one batched generate per agent; multi-turn trees)
    score/    rewards → scores of joint actions → advantages | actor-critic targets | preference pairs
    fit/      fit a critic or a joint reward model
    update/   policy-gradient, actor-critic and DPO steps on the live agents
    evaluate/ single-path evaluation; reward distributions of iterative rounds

and beside them the machinery they share: `agents/` (loading and saving models, the live agents and the
PolicyGroup they are driven through, decoding, log-probs, value heads, worker processes), `common/`
(seeds, user code) and `loops/` (the segment and round loops that chain the stages inside one task).
"""
