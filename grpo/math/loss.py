"""The GRPO loss on tensors: the objective's surrogate, times the TIS weight, plus beta * KL, aggregated per
token, per sequence or by a fixed constant; and its metrics. Shape legend as in grpo/math/algorithm.py.

Sources: GRPO (DeepSeekMath: 1/|o_i| per-sequence averaging, k3 KL); DAPO (token-level aggregation);
Dr. GRPO (a fixed normaliser); the objectives' own in grpo/math/objectives.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.math.algorithm import Aggregate, RatioLevel, k3_kl
from grpo.math.objectives import RECOMMENDED, Objective, Params, Surrogate, surrogate


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    *,
    mode: Aggregate = "token",
    max_tokens: int | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> Tensor:
    """Reduce an (N, T) per-token loss to a scalar.

    - ``"token"`` (DAPO): sum over valid tokens / number of valid tokens.
    - ``"sequence"`` (DeepSeekMath): mean over completions of each one's token mean (1/|o_i|).
    - ``"fixed"`` (Dr. GRPO): sum over valid tokens / (N * max_tokens).

    Sequences count only when they have a token in the loss (a completion
    masked whole leaves both normalisers). ``total_tokens`` and
    ``total_sequences`` replace this batch's own counts
    by those of the whole batch it is part of: a micro-batch, or one rank's
    share, then contributes exactly its part of the full-batch loss, so
    accumulating micro-batches (or all-reducing ranks) gives the full-batch
    gradient.
    """
    masked = per_token * mask
    # a sequence with no token in the loss (cut and masked, DAPO's overlong filter) is not counted
    n_seq = float((mask.sum(dim=1) > 0).sum()) if total_sequences is None else float(total_sequences)
    if mode == "token":
        n_tok = mask.sum() if total_tokens is None else total_tokens
        return masked.sum() / max(float(n_tok), 1.0)
    if mode == "sequence":
        lengths = mask.sum(dim=1).clamp(min=1)  # (N,)
        return (masked.sum(dim=1) / lengths).sum() / max(n_seq, 1.0)
    if mode == "fixed":
        if max_tokens is None or max_tokens <= 0:
            raise ValueError("aggregate='fixed' needs max_tokens > 0")
        return masked.sum() / (max(n_seq, 1.0) * max_tokens)
    raise ValueError(f"aggregate must be 'token', 'sequence' or 'fixed', got {mode!r}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    objective: Objective = "ppo",
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_cap: float = 20.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    ratio_level: RatioLevel = "token",
    aggregate: Aggregate | None = None,
    max_tokens: int | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    tis_weight: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective, to minimise: the objective's surrogate plus beta * KL(pi_theta || pi_ref).

    logp, old_logp, ref_logp, mask: (N, T) log-probs of the sampled tokens under
    the current, sampling-time and reference policies, and the completion mask.
    advantages: (N,). ``objective`` picks the surrogate (grpo/math/objectives.py: ppo, cispo,
    sapo, gmpo, dppo_tv, dppo_kl), each reading clip_low / clip_high its own way (PPO's and
    CISPO's ratio bounds 1 - eps_low, 1 + eps_high; GMPO's log-ratio bounds; DPPO's divergence
    thresholds), ``ratio_cap`` (DPPO's truncation C of its weight) and SAPO's temperatures;
    ``ratio_level="sequence"`` (GSPO) is PPO's only. ``aggregate`` None takes the
    objective's own (token; sequence for sapo and gmpo).
    Returns the scalar loss and detached metrics:
    ``ratio_mean``, ``clip_frac_low`` (tokens with A < 0 the objective's clip or mask acted on:
    for PPO rho < 1-eps_low, where the clip stops a decrease), ``clip_frac_high`` (the same with
    A > 0), and ``kl`` when beta > 0. See :func:`aggregate_loss` for the totals.
    ``tis_weight`` (N, T), from :func:`tis_weights`, multiplies each token's
    surrogate (not the KL term): old_logp is then the trainer's own log-probs
    and the weight carries the sampler's.
    """
    chosen = surrogate(objective)
    if ratio_level != "token" and objective != "ppo":
        raise ValueError(f"ratio_level {ratio_level!r} is PPO's (GSPO); objective {objective!r} works per token")
    mask = mask.to(logp.dtype)
    params = Params(clip_low, clip_high, ratio_cap, sapo_tau_pos, sapo_tau_neg, ratio_level)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (N, 1)
    out = chosen(logp, old_logp, adv, mask, params)
    per_token, kl = with_weight_and_kl(out.loss, logp, ref_logp, beta, tis_weight)  # (N, T)
    loss = aggregate_loss(per_token, mask, mode=aggregate or RECOMMENDED[objective].aggregate,
                          max_tokens=max_tokens, total_tokens=total_tokens, total_sequences=total_sequences)
    return loss, loss_metrics(out, adv, mask, kl)



def with_weight_and_kl(per_token: Tensor, logp: Tensor, ref_logp: Tensor | None, beta: float,
                       tis_weight: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The surrogate's per-token loss (N, T) times the TIS weight, plus beta * KL(pi_theta || pi_ref) (k3)
    when beta > 0; and that KL (N, T), None without it."""
    if tis_weight is not None:
        per_token = per_token * tis_weight
    kl = None
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp)  # (N, T)
        per_token = per_token + beta * kl
    return per_token, kl

@torch.no_grad()
def loss_metrics(out: Surrogate, adv: Tensor, mask: Tensor, kl: Tensor | None) -> dict[str, Tensor]:
    """Token means over the mask: ``ratio_mean``, ``clip_frac_low`` (clipped or masked tokens with
    A < 0), ``clip_frac_high`` (with A > 0), and ``kl`` when there is a KL term; adv (N, 1)."""
    n_valid = mask.sum().clamp(min=1)
    low = out.clipped & (adv < 0)  # (N, T)
    high = out.clipped & (adv > 0)
    metrics = {
        "ratio_mean": (out.ratio * mask).sum() / n_valid,
        "clip_frac_low": (low.to(mask.dtype) * mask).sum() / n_valid,
        "clip_frac_high": (high.to(mask.dtype) * mask).sum() / n_valid,
    }
    if kl is not None:
        metrics["kl"] = (kl * mask).sum() / n_valid
    return metrics
