"""KL to a frozen reference model, estimated at generation time.

Per completion, Schulman's k3 estimator summed over the response tokens:

    KL ≈ Σ_t [ exp(ℓ_ref − ℓ_pol) − (ℓ_ref − ℓ_pol) − 1 ]

with ℓ the token log-probs of the policy and of the frozen reference, from one padded forward each
(no gradients). Each agent's return of its own completion k becomes R_k − coef · KL_k *before* the
baseline and normalization, so a completion that drifts from the reference earns less.
"""

import torch

from coopflow.stages.agents.logprobs import completion_mask, sequence_logprobs


@torch.no_grad()
def k3_kl(policy, reference, prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> list[float]:
    """Summed k3 KL per completion ([B] floats; 0 for identical models)."""
    _, pol = sequence_logprobs(policy, prompts, completions, pad_id, return_tokens=True)
    _, ref = sequence_logprobs(reference, prompts, completions, pad_id, return_tokens=True)
    ref = ref.to(pol.device)
    mask = completion_mask(completions, pol)
    d = (ref - pol).double()
    k3 = (torch.exp(d) - d - 1) * mask
    return k3.sum(-1).tolist()


def apply_reference_kl(returns: list[float], kls: list[float], coef: float) -> list[float]:
    """R'_k = R_k − coef · KL_k (the reference's MAGRPO return adjustment)."""
    if len(returns) != len(kls):
        raise ValueError(f"{len(returns)} returns but {len(kls)} KL values")
    return [r - coef * k for r, k in zip(returns, kls)]
