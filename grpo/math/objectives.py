"""The policy objectives: each a per-token loss of the ratio and the advantage, chosen once by name.

Shape legend as in grpo/math/algorithm.py: N sequences, T completion tokens.
Each surrogate takes the current and old log-probs (N, T), the advantages
(N, 1) and the mask (N, T), and returns a :class:`Surrogate`: the per-token
loss to minimise (aggregated afterwards by grpo.math.loss.aggregate_loss),
the token ratio rho_t (for ``ratio_mean``) and which tokens its clip or mask
acted on (for ``clip_frac_low`` / ``clip_frac_high``, split by the sign of A).
The definitions follow verl's ``core_algos`` policy losses:

- ``ppo``: PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with
  DAPO's clip-higher (arXiv:2503.14476), per token or per sequence (GSPO,
  arXiv:2507.18071). verl's dual clip for A < 0 is not part of it.
- ``cispo``: MiniMax-M1's CISPO (arXiv:2506.13585).
- ``sapo``: Qwen's soft adaptive policy optimisation (arXiv:2511.20347).
- ``gmpo``: geometric-mean policy optimisation (arXiv:2507.20673), verl's ``geo_mean``.
- ``dppo_tv`` and ``dppo_kl``: divergence-proximal policy optimisation (arXiv:2602.04879).

Deviation from verl: the log-ratio is taken over the mask (a padded token's
ratio is 1), and with truncated importance weights GMPO's per-sequence loss
is weighted token by token like every other objective (verl reduces the
weights to their per-sequence geometric mean first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from grpo.math.recommended import (
    RECOMMENDED as RECOMMENDED,  # each objective's settings when the user gives none
)

Objective = Literal["ppo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl"]
LOG_RATIO_BOUND = 20.0  # verl clamps log(rho) to [-20, 20] before exp in CISPO, SAPO and DPPO


@dataclass(frozen=True)
class Params:
    """What the objectives read: clip bounds (each objective reads them its own way), DPPO's ratio cap C,
    SAPO's temperatures, and the ratio level (per token, or GSPO's per sequence; PPO only)."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_cap: float = 20.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    ratio_level: str = "token"


@dataclass(frozen=True)
class Surrogate:
    loss: Tensor  # (N, T) per-token loss to minimise
    ratio: Tensor  # (N, T) rho_t, detached
    clipped: Tensor  # (N, T) bool: the objective's clip or mask acted on the token


def log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, *, bound: float | None = None) -> Tensor:
    """log rho_t = log pi_theta(o_t) - log pi_old(o_t) over the mask, (N, T); clamped to [-bound, bound]."""
    delta = (logp - old_logp) * mask
    return delta if bound is None else delta.clamp(-bound, bound)


def importance_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, *, level: str = "token") -> Tensor:
    """rho_t = pi_theta(o_t) / pi_old(o_t) per token, or GSPO's per-sequence ratio.

    GSPO's s_i = exp(mean_t (log pi_theta - log pi_old)) over the valid tokens
    of completion i is broadcast over its tokens, so the clipping below acts
    on whole sequences. Returns (N, T).
    """
    delta = log_ratio(logp, old_logp, mask)  # (N, T)
    if level == "token":
        return torch.exp(delta)
    if level == "sequence":
        lengths = mask.sum(dim=1).clamp(min=1)  # (N,)
        seq_log_ratio = delta.sum(dim=1) / lengths  # (N,)
        return torch.exp(seq_log_ratio).unsqueeze(1).expand_as(logp)
    raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")


def clipped_surrogate(ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float) -> Tensor:
    """PPO's per-token loss -min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A), (N, T); advantages (N,).

    ``clip_high > clip_low`` is DAPO's clip-higher: it leaves more room to
    raise the probability of unlikely tokens that earned a positive advantage.
    """
    adv = advantages.unsqueeze(1)  # (N, 1)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped_ratio * adv)


def ppo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A); rho per token, or GSPO's
    s_i = exp(mean_t log rho_t) broadcast over completion i."""
    ratio = importance_ratio(logp, old_logp, mask, level=p.ratio_level)  # (N, T)
    loss = clipped_surrogate(ratio, adv.squeeze(1), clip_low=p.clip_low, clip_high=p.clip_high)
    clipped = ((ratio < 1.0 - p.clip_low) & (adv < 0)) | ((ratio > 1.0 + p.clip_high) & (adv > 0))
    return Surrogate(loss, ratio.detach(), clipped)


def cispo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """CISPO: -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A log pi_theta(o_t).

    The clipped ratio is a stop-gradient weight, so every token keeps a
    gradient (PPO's clip drops it); clip_low = 1 leaves no lower bound, as
    MiniMax-M1 trains.
    """
    ratio = torch.exp(log_ratio(logp, old_logp, mask, bound=LOG_RATIO_BOUND))  # (N, T)
    weight = ratio.clamp(1.0 - p.clip_low, 1.0 + p.clip_high).detach()
    loss = -weight * adv * (logp * mask)
    return Surrogate(loss, ratio.detach(), (ratio != weight))


def sapo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """SAPO: -f(rho, tau) A, the soft gate f(rho, tau) = sigmoid(tau (rho - 1)) * 4 / tau,
    tau = tau_pos where A > 0, else tau_neg. Its gradient is rho A grad log pi at rho = 1 and fades
    smoothly away from it (no hard clip; nothing counts as clipped)."""
    ratio = torch.exp(log_ratio(logp, old_logp, mask, bound=LOG_RATIO_BOUND))  # (N, T)
    tau = torch.where(adv > 0, p.sapo_tau_pos, p.sapo_tau_neg).to(ratio.dtype)  # (N, 1)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return Surrogate(-gate * adv, ratio.detach(), torch.zeros_like(mask, dtype=torch.bool))


def gmpo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """GMPO: completion i's loss -A_i exp(mean_t clip_sgn(log rho_t)), broadcast over its tokens.

    The clip is in log space: log rho_t in [-eps_low, eps_high], applied only
    on the side that limits the objective (for A > 0 the upper, for A < 0 the
    lower: sgn(A) min(sgn(A) log rho, sgn(A) clip(log rho))). The geometric
    mean of the token ratios is less sensitive to one outlier token than
    their arithmetic mean.
    """
    delta = log_ratio(logp, old_logp, mask)  # (N, T)
    bounded = delta.clamp(-p.clip_low, p.clip_high)
    sign = torch.sign(adv)  # (N, 1)
    kept = sign * torch.minimum(sign * delta, sign * bounded)  # (N, T)
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)  # (N, 1)
    seq_ratio = torch.exp((kept * mask).sum(dim=1, keepdim=True) / lengths)  # (N, 1)
    loss = (-adv * seq_ratio).expand_as(delta)
    return Surrogate(loss, torch.exp(delta).detach(), delta != bounded)


def _dppo(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params, inside: Tensor) -> Surrogate:
    """-A sg(min(rho, C)) log pi_theta(o_t) on the tokens ``inside`` the trust region, 0 elsewhere."""
    ratio = torch.exp(log_ratio(logp, old_logp, mask, bound=LOG_RATIO_BOUND))  # (N, T)
    weight = ratio.clamp(max=p.ratio_cap).detach()
    loss = -adv * weight * (logp * mask) * inside.to(ratio.dtype)
    return Surrogate(loss, ratio.detach(), ~inside)


def dppo_tv(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """DPPO-Binary-TV: a token leaves the loss once its probability moved past the threshold in the
    direction A pushes it: pi - pi_old > delta_high (clip_high) for A > 0, pi_old - pi > delta_low
    (clip_low) otherwise. The weight sg(min(rho, C)) keeps the gradient of rho A (C = ratio_cap)."""
    with torch.no_grad():
        moved = torch.exp(logp) - torch.exp(old_logp)  # (N, T)
        inside = torch.where(adv > 0, moved <= p.clip_high, moved >= -p.clip_low)
    return _dppo(logp, old_logp, adv, mask, p, inside)


def dppo_kl(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, p: Params) -> Surrogate:
    """DPPO-Binary-KL: as dppo_tv with the binary KL between Bernoulli(pi_old) and Bernoulli(pi),
    pi_old log(pi_old / pi) + (1 - pi_old) log((1 - pi_old + 1e-8) / (1 - pi + 1e-8)), as the divergence;
    a token leaves once it exceeds the threshold while moving in A's direction."""
    with torch.no_grad():
        prob, old_prob = torch.exp(logp), torch.exp(old_logp)
        binary_kl = old_prob * (old_logp - logp) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        up = (binary_kl <= p.clip_high) | (prob <= old_prob)
        down = (binary_kl <= p.clip_low) | (prob >= old_prob)
        inside = torch.where(adv > 0, up, down)
    return _dppo(logp, old_logp, adv, mask, p, inside)


SURROGATES: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor, Params], Surrogate]] = {
    "ppo": ppo, "cispo": cispo, "sapo": sapo, "gmpo": gmpo, "dppo_tv": dppo_tv, "dppo_kl": dppo_kl,
}

def surrogate(objective: str) -> Callable[[Tensor, Tensor, Tensor, Tensor, Params], Surrogate]:
    """The named objective's surrogate; a ValueError naming the choices for another name."""
    if objective not in SURROGATES:
        raise ValueError(f"objective must be one of {', '.join(SURROGATES)}, got {objective!r}")
    return SURROGATES[objective]
