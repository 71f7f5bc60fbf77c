"""The GRPO math as pure functions of tensors.

Shape legend used on tensor lines: B prompts, G samples per prompt,
N = B*G sequences, T completion tokens, V vocabulary.

Sources:
- GRPO: Shao et al. 2024, "DeepSeekMath" (group-standardised advantages,
  1/|o_i| per-sequence averaging, k3 KL estimator towards a reference).
- DAPO: Yu et al. 2025 (clip-higher, token-level aggregation).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training" (no std
  scaling, a fixed normaliser instead of per-sequence lengths).
- GSPO: Zheng et al. 2025 (one importance ratio per sequence, the geometric
  mean of the token ratios).
- k3: Schulman 2020, http://joschu.net/blog/kl-approx.html
- Truncated importance sampling (TIS) for the sampler/trainer mismatch: Yao et al.
  2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (https://fengyao.notion.site/off-policy-rl); the sequence-level mask follows
  verl's rollout importance sampling (a sequence outside the bounds leaves the loss).
- Sequence-level importance ratio (the whole completion's prod_t rho_t, truncated), which corrects
  the distribution a completion was drawn from when its advantage depends on the whole completion,
  e.g. a sampler K updates behind (what it leaves uncorrected: ``tis_weights``): Liu, Li et al.
  2025, "When Speed Kills Stability" (https://richardli.xyz/rl-collapse, part 2: token-level
  vs sequence-level correction).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

AdvantageScale = Literal["group", "batch", "none"]
RatioLevel = Literal["token", "sequence"]
TisLevel = Literal["token", "sequence", "sequence_ratio"]
Aggregate = Literal["token", "sequence", "fixed"]


def group_advantages(
    rewards: Tensor, group_size: int, *, scale: AdvantageScale = "group", eps: float = 1e-6,
    valid: Tensor | None = None,
) -> Tensor:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + eps), groups of G consecutive rewards.

    ``scale="group"`` is DeepSeekMath's GRPO; ``"batch"`` divides by the std of
    the whole batch instead (more robust when a group's std is tiny);
    ``"none"`` keeps only the centring, as Dr. GRPO recommends. The std is the
    unbiased one (as ``torch.std``). A group whose rewards are all equal gets
    A_i = 0 under every scale: it carries no learning signal.

    ``valid`` (N,) bool leaves rows out (a row that errored: its reward is no
    verdict on the completion): the mean and std are over a group's valid
    members, an invalid row gets A_i = 0, and so does every row of a group
    with fewer than two valid members (nothing to compare it with).
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2, got {group_size}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    grouped = rewards.float().view(-1, group_size)  # (B, G)
    if valid is not None and not bool(valid.all()):
        return _partial_group_advantages(grouped, valid.view(-1, group_size), scale, eps)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (B, G)
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (rewards.float().std() + eps)
    return centred.reshape(-1)  # (N,)


def _partial_group_advantages(grouped: Tensor, valid: Tensor, scale: str, eps: float) -> Tensor:
    """group_advantages over the valid members (B, G) of each group; 0 elsewhere and in groups of fewer
    than two. Equal to it when every row is valid (the same formulas, on masked sums)."""
    weight = valid.float()  # (B, G)
    count = weight.sum(dim=1, keepdim=True)  # (B, 1)
    kept = (count >= 2).float() * weight  # (B, G) the rows that get an advantage
    values = torch.where(valid, grouped, 0.0)  # (B, G) invalid rows' values (NaN included) never enter a sum
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)  # (B, 1)
    centred = torch.where(kept > 0, grouped - mean, 0.0)  # (B, G)
    if scale == "group":
        var = (centred**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)  # (B, 1) unbiased
        centred = centred / (var.sqrt() + eps)
    elif scale == "batch":
        chosen = grouped[kept > 0]  # (M,)
        centred = centred / ((chosen.std() if chosen.numel() > 1 else chosen.new_zeros(())) + eps)
    return centred.reshape(-1)  # (N,)


def group_varies(grouped: Tensor, valid: Tensor | None = None) -> Tensor:
    """(B,) True where a group's rewards (B, G) are not all equal: the groups with a learning signal.

    The one definition used everywhere (dynamic sampling, the frontier sampler,
    the step's metrics, pre-flight), on the raw rewards whatever their scale: a
    reward in [-1, 1], a weighted sum or a format penalty varies when its values
    differ, not when their clamp to [0, 1] does. With ``valid`` (B, G), over the
    valid members only (rows that errored are no verdict): a group with fewer
    than two of them does not vary.
    """
    if valid is None:
        return grouped.max(dim=1).values > grouped.min(dim=1).values
    high = torch.where(valid, grouped, float("-inf")).max(dim=1).values  # (B,)
    low = torch.where(valid, grouped, float("inf")).min(dim=1).values  # (B,)
    return high > low


def importance_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, *, level: RatioLevel = "token"
) -> Tensor:
    """rho_t = pi_theta(o_t) / pi_old(o_t) per token, or GSPO's per-sequence ratio.

    GSPO's s_i = exp(mean_t (log pi_theta - log pi_old)) over the valid tokens
    of completion i is broadcast over its tokens, so the clipping below acts
    on whole sequences. Returns (N, T).
    """
    log_ratio = (logp - old_logp) * mask  # (N, T)
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        lengths = mask.sum(dim=1).clamp(min=1)  # (N,)
        seq_log_ratio = log_ratio.sum(dim=1) / lengths  # (N,)
        return torch.exp(seq_log_ratio).unsqueeze(1).expand_as(logp)
    raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float
) -> Tensor:
    """PPO's per-token loss -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A), (N, T).

    ``clip_high > clip_low`` is DAPO's clip-higher: it leaves more room to
    raise the probability of unlikely tokens that earned a positive advantage.
    """
    adv = advantages.unsqueeze(1)  # (N, 1)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped_ratio * adv)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimate of KL(pi_theta || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1.

    Unbiased, always non-negative, and low-variance (Schulman 2020); the
    estimator DeepSeekMath uses. (N, T).
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def tis_weights(
    trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float, level: TisLevel = "token"
) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weights for tokens sampled by another engine than the trainer's, (N, T), detached.

    The sampler (vLLM, or any engine whose numerics differ) draws o_t from
    pi_sampler, while the loss assumes pi_trainer, the same weights computed
    by the training pass. With delta_t = log pi_trainer(o_t) - log pi_sampler(o_t):

    - ``"token"`` (TIS): w_t = min(exp(delta_t), C), C = ``cap``;
    - ``"sequence"`` (masking): w_i = 1 for a completion whose geometric-mean
      ratio exp(mean_t delta_t) lies in [1/C, C], else 0 for all its tokens;
    - ``"sequence_ratio"``: every token of completion i weighted by
      w_i = min(exp(sum_t delta_t), C), the whole completion's importance ratio
      prod_t pi_trainer(o_t | h_t) / pi_sampler(o_t | h_t), truncated. Token
      weights are biased when A_i depends on the whole completion (the prefix
      h_t is the sampler's draw too). What this one corrects, exactly: the law
      each completion was drawn from. For a per-completion term f(o) that is
      fixed before the batch is drawn, E_{o~pi_sampler}[w(o) f(o) grad log
      pi_trainer(o)] = E_{o~pi_trainer}[f(o) grad log pi_trainer(o)] when no
      ratio reaches C (tests/test_async_correction.py: A(o) = r(o) - b with a
      fixed b, every completion of one length). GRPO's loss is not such a term,
      and these stay computed from the sampler's draws, uncorrected:
      the group-normalised advantage (mean and std over the G completions
      pi_sampler drew: A_i depends on the other rows of its group, which the
      row's own ratio does not reweight); the loss normaliser of aggregate
      "token" (the batch's total tokens, a sum over the drawn lengths; "fixed"
      is a constant, and "sequence"'s 1/|o_i| a function of o_i, so those two
      are not at issue); the cap (a truncated ratio leans towards pi_sampler);
      and the KL term, which the weight does not multiply. So it removes the
      bias of the per-token weights under a lag, not all of the lag's; its
      variance grows with the length and the mismatch (a sampler K updates
      behind, asynchronous GRPO).

    Metrics, means over valid tokens: ``sampler_logp_diff`` mean |delta_t|,
    ``sampler_kl`` the k3 estimate of KL(pi_sampler || pi_trainer) (the tokens
    are the sampler's draws), ``tis_capped_frac`` the share of tokens capped
    (token level), masked (sequence level) or in a capped completion
    (sequence_ratio level); and ``sampler_logp_diff_max``,
    max |delta_t| over the valid tokens (0 without any): a mean hides the few
    tokens whose probabilities the two disagree on, which is where a bf16
    output layer shows (see grpo/forward.py, ``head_logits``).
    """
    with torch.no_grad():
        mask = mask.to(trainer_logp.dtype)
        delta = (trainer_logp - sampler_logp) * mask  # (N, T)
        if level == "token":
            ratio = torch.exp(delta)
            capped = (ratio > cap).to(mask.dtype)
            weights = ratio.clamp(max=cap)
        elif level == "sequence":
            seq = delta.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (N,) mean log-ratio
            inside = (seq.abs() <= math.log(cap)).to(mask.dtype).unsqueeze(1)  # (N, 1)
            weights = inside.expand_as(delta)
            capped = 1.0 - weights
        elif level == "sequence_ratio":
            ratio = torch.exp(delta.sum(dim=1, keepdim=True))  # (N, 1) prod_t rho_t; inf past float range
            capped = (ratio > cap).to(mask.dtype).expand_as(delta)
            weights = ratio.clamp(max=cap).expand_as(delta)
        else:
            raise ValueError(f"tis_level must be 'token', 'sequence' or 'sequence_ratio', got {level!r}")
        n_valid = mask.sum().clamp(min=1)
        metrics = {
            "sampler_logp_diff": delta.abs().sum() / n_valid,
            "sampler_logp_diff_max": delta.abs().amax() if delta.numel() else delta.new_zeros(()),
            "sampler_kl": (k3_kl(sampler_logp, trainer_logp) * mask).sum() / n_valid,
            "tis_capped_frac": (capped * mask).sum() / n_valid,
        }
    return weights * mask, metrics


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
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_level: RatioLevel = "token",
    aggregate: Aggregate = "token",
    max_tokens: int | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    tis_weight: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective, to minimise: clipped surrogate plus beta * KL(pi_theta || pi_ref).

    logp, old_logp, ref_logp, mask: (N, T) log-probs of the sampled tokens under
    the current, sampling-time and reference policies, and the completion mask.
    advantages: (N,). Returns the scalar loss and detached metrics:
    ``ratio_mean``, ``clip_frac_low`` (rho < 1-eps_low with A < 0: the clip
    stops a decrease), ``clip_frac_high`` (rho > 1+eps_high with A > 0), and
    ``kl`` when beta > 0. See :func:`aggregate_loss` for the totals.
    ``tis_weight`` (N, T), from :func:`tis_weights`, multiplies each token's
    surrogate (not the KL term): old_logp is then the trainer's own log-probs
    and the weight carries the sampler's.
    """
    mask = mask.to(logp.dtype)
    ratio = importance_ratio(logp, old_logp, mask, level=ratio_level)  # (N, T)
    per_token = clipped_surrogate(ratio, advantages, clip_low=clip_low, clip_high=clip_high)
    if tis_weight is not None:
        per_token = per_token * tis_weight
    kl = None
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        kl = k3_kl(logp, ref_logp)  # (N, T)
        per_token = per_token + beta * kl
    loss = aggregate_loss(per_token, mask, mode=aggregate, max_tokens=max_tokens, total_tokens=total_tokens,
                          total_sequences=total_sequences)
    return loss, loss_metrics(ratio, advantages, mask, kl, clip_low=clip_low, clip_high=clip_high)


@torch.no_grad()
def loss_metrics(ratio: Tensor, advantages: Tensor, mask: Tensor, kl: Tensor | None, *, clip_low: float,
                 clip_high: float) -> dict[str, Tensor]:
    """Token means over the mask: ``ratio_mean``, ``clip_frac_low`` (rho < 1-eps_low with A < 0),
    ``clip_frac_high`` (rho > 1+eps_high with A > 0), and ``kl`` when there is a KL term."""
    n_valid = mask.sum().clamp(min=1)
    adv = advantages.unsqueeze(1)  # (N, 1)
    low = (ratio < 1.0 - clip_low) & (adv < 0)  # (N, T)
    high = (ratio > 1.0 + clip_high) & (adv > 0)
    metrics = {
        "ratio_mean": (ratio * mask).sum() / n_valid,
        "clip_frac_low": (low.to(mask.dtype) * mask).sum() / n_valid,
        "clip_frac_high": (high.to(mask.dtype) * mask).sum() / n_valid,
    }
    if kl is not None:
        metrics["kl"] = (kl * mask).sum() / n_valid
    return metrics
