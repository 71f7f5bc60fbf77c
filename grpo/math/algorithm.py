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

from grpo.math.objectives import clipped_surrogate as clipped_surrogate  # re-exported: part of the math's API
from grpo.math.objectives import importance_ratio as importance_ratio

AdvantageScale = Literal["group", "batch", "none"]
Estimator = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "passk"]
RatioLevel = Literal["token", "sequence"]
TisLevel = Literal["token", "sequence", "sequence_ratio"]
TisMode = Literal["truncate", "mask"]
Aggregate = Literal["token", "sequence", "fixed"]


def group_advantages(
    rewards: Tensor, group_size: int, *, estimator: Estimator = "grpo", scale: AdvantageScale = "group",
    eps: float = 1e-6, valid: Tensor | None = None, mask: Tensor | None = None,
) -> Tensor:
    """The advantages A_i (N,) of rewards r_i (N,) in groups of G consecutive completions.

    - ``"grpo"`` (DeepSeekMath, arXiv:2402.03300): A_i = (r_i - mean(r_group)) / (std(r_group) + eps).
      ``scale="group"`` is that; ``"batch"`` divides by the std of the whole batch instead (more
      robust when a group's std is tiny); ``"none"`` keeps only the centring, as Dr. GRPO
      (arXiv:2503.20783) recommends. The std is the unbiased one (as ``torch.std``).
    - ``"rloo"`` (Ahmadian et al., arXiv:2402.14740): A_i = r_i - mean_{j != i} r_j
      = G / (G - 1) (r_i - mean(r_group)); no scaling.
    - ``"passk"`` (Chen et al., arXiv:2503.19595): only the group's best completion gets an
      advantage, r_max - r_second_max (divided as ``scale`` says, by the group's std by default);
      the others get 0.
    - ``"reinforce_pp"`` (REINFORCE++, Hu et al., arXiv:2501.03262): r_i whitened over the batch's
      tokens, A_i = (r_i - mu) / sqrt(var + 1e-8), mu and the unbiased var over every token in the
      loss (each completion counts its length; 1e-8 under the root as verl has it); no group baseline.
    - ``"reinforce_pp_baseline"``: the group mean subtracted first, then whitened as reinforce_pp.

    ``scale`` is read by grpo and passk only. ``mask`` (N, T), or its row sums (N,), gives the
    token counts REINFORCE++ weighs by (required for those two). A group whose rewards are all equal
    gets A_i = 0 under grpo, rloo and passk, and under reinforce_pp_baseline the batch's common shift
    -mu / sd (verl's numbers: it trains on it); see :func:`group_varies` for what teaches under each.

    ``valid`` (N,) bool leaves rows out (a row that errored: its reward is no
    verdict on the completion): the statistics are over the valid members,
    an invalid row gets A_i = 0, and so does every row of a group with fewer
    valid members than the estimator compares (two; one for reinforce_pp).
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
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    grouped = rewards.float().view(-1, group_size)  # (B, G)
    valid = None if valid is None else valid.view(-1, group_size)  # (B, G)
    tokens = None if mask is None else (mask.sum(dim=1) if mask.dim() == 2 else mask).float().to(grouped.device)
    return ESTIMATORS[estimator](grouped, valid, scale, eps, tokens)  # (N,)


def members_needed(estimator: str) -> int:
    """Valid members a group needs for its rows to get an advantage: two to compare, except under
    REINFORCE++, whose baseline is the batch's (the errored-row policy reads this too)."""
    return 1 if estimator == "reinforce_pp" else 2


def _kept(grouped: Tensor, valid: Tensor | None, estimator: str) -> tuple[Tensor, Tensor]:
    """The rows (B, G) that get an advantage (valid, in a group with enough valid members) and the
    rewards with the others' values (NaN included) set to 0, so that they never enter a sum."""
    full = torch.ones_like(grouped, dtype=torch.bool) if valid is None else valid
    kept = full & (full.sum(dim=1, keepdim=True) >= members_needed(estimator))  # (B, G)
    return kept, torch.where(kept, grouped, 0.0)


def _grpo(grouped: Tensor, valid: Tensor | None, scale: str, eps: float, tokens: Tensor | None) -> Tensor:
    """GRPO's advantages, (N,); the whole-group path unchanged to the bit."""
    if valid is not None and not bool(valid.all()):
        return _partial_group_advantages(grouped, valid, scale, eps)
    return _grpo_advantages(grouped, scale, eps)


def _rloo(grouped: Tensor, valid: Tensor | None, scale: str, eps: float, tokens: Tensor | None) -> Tensor:
    """A_i = r_i - mean of the other kept members = n / (n - 1) (r_i - mean), n kept per group; (N,)."""
    kept, values = _kept(grouped, valid, "rloo")
    count = kept.sum(dim=1, keepdim=True).float()  # (B, 1)
    centred = (values - _masked_mean(values, kept)) * count / (count - 1).clamp(min=1)
    return torch.where(kept, centred, 0.0).reshape(-1)


def _passk(grouped: Tensor, valid: Tensor | None, scale: str, eps: float, tokens: Tensor | None) -> Tensor:
    """r_max - r_second_max on each group's best kept member, 0 elsewhere; scaled as ``scale``; (N,)."""
    kept, values = _kept(grouped, valid, "passk")
    top, where = torch.where(kept, values, float("-inf")).topk(2, dim=1)  # (B, 2)
    gap = torch.where(kept.any(dim=1), top[:, 0] - top[:, 1], 0.0)  # (B,)
    if scale == "group":
        count = kept.sum(dim=1).clamp(min=2).float()
        centred = torch.where(kept, values - _masked_mean(values, kept), 0.0)
        gap = gap / (((centred**2).sum(dim=1) / (count - 1)).sqrt() + eps)
    elif scale == "batch":
        chosen = values[kept]
        gap = gap / ((chosen.std() if chosen.numel() > 1 else chosen.new_zeros(())) + eps)
    return torch.zeros_like(values).scatter(1, where[:, :1], gap.unsqueeze(1)).reshape(-1)


def _reinforce_pp(grouped: Tensor, valid: Tensor | None, scale: str, eps: float, tokens: Tensor | None) -> Tensor:
    """REINFORCE++: the rewards whitened over the batch's tokens, no group baseline; (N,)."""
    kept, values = _kept(grouped, valid, "reinforce_pp")
    return _whiten(values, _token_weight(tokens, kept)).reshape(-1)


def _reinforce_pp_baseline(grouped: Tensor, valid: Tensor | None, scale: str, eps: float, tokens: Tensor | None
                           ) -> Tensor:
    """REINFORCE++ with the group mean subtracted before the whitening; (N,)."""
    kept, values = _kept(grouped, valid, "reinforce_pp_baseline")
    centred = torch.where(kept, values - _masked_mean(values, kept), 0.0)
    return _whiten(centred, _token_weight(tokens, kept)).reshape(-1)


def _token_weight(tokens: Tensor | None, kept: Tensor) -> Tensor:
    """(B, G) each kept row's token count, 0 for the others: REINFORCE++'s whitening weights."""
    if tokens is None:
        raise ValueError("REINFORCE++ whitens over the batch's tokens: pass mask")
    return tokens.view_as(kept) * kept


def _grpo_advantages(grouped: Tensor, scale: str, eps: float) -> Tensor:
    """GRPO's (r - mean) / (std + eps) over whole groups (B, G), as ``scale`` says; (N,)."""
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (B, G)
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (grouped.reshape(-1).std() + eps)
    return centred.reshape(-1)  # (N,)


def _masked_mean(values: Tensor, kept: Tensor) -> Tensor:
    """(B, 1) each group's mean over its kept members."""
    return values.sum(dim=1, keepdim=True) / kept.sum(dim=1, keepdim=True).clamp(min=1)


def _whiten(values: Tensor, weight: Tensor) -> Tensor:
    """(x - mu) / sqrt(var + 1e-8) where weight > 0, 0 elsewhere; mu and the unbiased var over the
    tokens (each row counted ``weight`` times); (B, G)."""
    n = weight.sum()
    mu = (values * weight).sum() / n.clamp(min=1)
    var = ((values - mu) ** 2 * weight).sum() / n.clamp(min=1) * n / (n - 1).clamp(min=1)
    return torch.where(weight > 0, (values - mu) * torch.rsqrt(var + 1e-8), 0.0)


ESTIMATORS = {"grpo": _grpo, "rloo": _rloo, "reinforce_pp": _reinforce_pp,
              "reinforce_pp_baseline": _reinforce_pp_baseline, "passk": _passk}


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


def group_varies(grouped: Tensor, valid: Tensor | None = None, *, estimator: str = "grpo") -> Tensor:
    """(B,) True where a group's rewards (B, G) carry a signal of their own under ``estimator``: under
    grpo, rloo, passk and reinforce_pp, where its advantages are not all zero.

    The one definition used everywhere (dynamic sampling, the frontier sampler,
    the step's metrics, the errored-row policy, pre-flight), on the raw rewards whatever their scale:
    a reward in [-1, 1], a weighted sum or a format penalty varies when its values
    differ, not when their clamp to [0, 1] does. With ``valid`` (B, G), over the
    valid members only (rows that errored are no verdict).

    - grpo, rloo, reinforce_pp_baseline: the group's valid rewards are not all equal. Under
      reinforce_pp_baseline an all-equal group is False here but its advantages are not zero (as in
      verl): the whitening shifts its centred rewards, all 0, by the batch's token mean, the same
      -mu / sd for every such group, which no comparison within the group earned. Dynamic sampling
      drops it; with ``--no-filter-groups`` it trains on that shift (the update skips only groups
      whose advantages are all zero), and the step metrics count it in ``trained_zero_var_frac``
      and not in ``update_skipped_tokens_frac``;
    - passk: its two best valid rewards differ (only the best member gets an advantage);
    - reinforce_pp: the group has a valid member and the batch's valid rewards are not all equal
      (its baseline is the batch's).
    """
    valid = torch.ones_like(grouped, dtype=torch.bool) if valid is None else valid
    high = torch.where(valid, grouped, float("-inf"))  # (B, G)
    low = torch.where(valid, grouped, float("inf"))
    if estimator == "reinforce_pp":
        batch_varies = bool(high.max() > low.min())
        return valid.any(dim=1) & batch_varies
    if estimator == "passk":
        top = high.topk(2, dim=1).values  # (B, 2)
        return (top[:, 0] > top[:, 1]) & (valid.sum(dim=1) >= 2)
    return high.max(dim=1).values > low.min(dim=1).values


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimate of KL(pi_theta || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1.

    Unbiased, always non-negative, and low-variance (Schulman 2020); the
    estimator DeepSeekMath uses. (N, T).
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def tis_weights(
    trainer_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float, level: TisLevel = "token",
    mode: TisMode = "truncate", low: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Importance weights for tokens sampled by another engine than the trainer's, (N, T), detached, and
    their metrics. With delta_t = log pi_trainer(o_t) - log pi_sampler(o_t): ``mode="truncate"`` caps the
    weight at ``cap`` (token: min(exp(delta_t), C); sequence: the geometric mask, 1 when exp(mean_t delta_t)
    lies in [1/C, C], else 0; sequence_ratio: min(exp(sum_t delta_t), C) on every token of the completion);
    ``mode="mask"`` keeps a weight inside [``low``, ``cap``] and sets one outside to 0. What each level
    corrects and what it leaves (the group advantage, the normaliser, the cap, the KL term), and the
    metrics: docs/objectives.md, "Sampler/trainer mismatch corrections"."""
    with torch.no_grad():
        mask = mask.to(trainer_logp.dtype)
        delta = (trainer_logp - sampler_logp) * mask  # (N, T)
        weights, capped, masked = _mismatch_weights(delta, mask, cap=cap, level=level, mode=mode, low=low)
        n_valid = mask.sum().clamp(min=1)
        has_tokens = mask.sum(dim=1) > 0  # (N,)
        masked_rows = ((masked * mask).sum(dim=1) > 0) & has_tokens
        metrics = {
            "sampler_logp_diff": delta.abs().sum() / n_valid,
            "sampler_logp_diff_max": delta.abs().amax() if delta.numel() else delta.new_zeros(()),
            "sampler_kl": (k3_kl(sampler_logp, trainer_logp) * mask).sum() / n_valid,
            "tis_capped_frac": (capped * mask).sum() / n_valid,
            "tis_masked_tokens": (masked * mask).sum() / n_valid,
            "tis_masked_sequences": masked_rows.sum().to(mask.dtype) / has_tokens.sum().clamp(min=1),
        }
    return weights * mask, metrics


def _mismatch_weights(delta: Tensor, mask: Tensor, *, cap: float, level: str, mode: str, low: float
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """tis_weights' weights (N, T), and which tokens were capped or masked, and masked alone (N, T)."""
    if mode not in ("truncate", "mask"):
        raise ValueError(f"tis_mode must be 'truncate' or 'mask', got {mode!r}")
    if level == "sequence":
        seq = delta.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (N,) mean log-ratio
        if mode == "truncate":
            inside = seq.abs() <= math.log(cap)
        else:
            inside = (seq >= (math.log(low) if low > 0 else -math.inf)) & (seq <= math.log(cap))
        weights = inside.to(mask.dtype).unsqueeze(1).expand_as(delta)  # (N, T)
        return weights, 1.0 - weights, 1.0 - weights
    if level == "token":
        ratio = torch.exp(delta)  # (N, T)
    elif level == "sequence_ratio":
        ratio = torch.exp(delta.sum(dim=1, keepdim=True)).expand_as(delta)  # prod_t rho_t; inf past float range
    else:
        raise ValueError(f"tis_level must be 'token', 'sequence' or 'sequence_ratio', got {level!r}")
    if mode == "truncate":
        capped = (ratio > cap).to(mask.dtype)
        return ratio.clamp(max=cap), capped, torch.zeros_like(capped)
    inside = (ratio >= low) & (ratio <= cap)
    masked = (~inside).to(mask.dtype)
    return torch.where(inside, ratio, 0.0), masked, masked


TEMPERATURE_RANGE = (0.3, 1.0)  # the adapted sampling temperature stays within these bounds


def adapted_temperature(temperature: float, entropy: float, target: float,
                        bounds: tuple[float, float] = TEMPERATURE_RANGE) -> float:
    """The next step's sampling temperature, holding the policy's per-token entropy near ``target``
    (E3, arXiv 2505.18573): T (target / H)^(1/4), clipped to ``bounds``; H the step's mean per-token
    entropy of softmax(logits / T) on the completions it trained. A step with no entropy measured (nothing
    trained, or not finite) leaves T as it is."""
    if not math.isfinite(entropy) or entropy <= 0.0:
        return temperature
    low, high = bounds
    return min(max(temperature * (target / entropy) ** 0.25, low), high)
