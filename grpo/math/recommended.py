"""Each objective's settings when the user gives none: the clip values and the aggregation, with where each
value comes from (docs/objectives.md). Plain numbers, no torch: the configuration reads them before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recommended:
    """An objective's settings when the user gives none: the clip values and the aggregation."""

    clip_low: float
    clip_high: float
    aggregate: str


# Each objective's settings when the user gives none, and where each value comes from (docs/objectives.md):
# PPO: DAPO's clip-higher; CISPO: no lower bound, ScaleRL's cap of 5 on the weight (arXiv:2510.13786);
# SAPO and GMPO: per-sequence averaging as in verl (SAPO's clips are unused); GMPO: (e^-0.4, e^0.4).
# DPPO: only the thresholds (TV 0.15, binary KL 0.05) are verl's DPPO recipe's
# (examples/dppo_trainer/run_qwen30b_dppo.sh); ratio_cap 20 is the fallback of verl's DPPO loss in
# core_algos.py, and token aggregation is grpo's default. The recipe itself sets clip_ratio_c=10000
# (no truncation) and seq-mean-token-sum-norm (grpo's fixed) with --scale none.
RECOMMENDED: dict[str, Recommended] = {
    "ppo": Recommended(0.2, 0.28, "token"),
    "cispo": Recommended(1.0, 4.0, "token"),
    "sapo": Recommended(0.2, 0.28, "sequence"),
    "gmpo": Recommended(0.4, 0.4, "sequence"),
    "dppo_tv": Recommended(0.15, 0.15, "token"),
    "dppo_kl": Recommended(0.05, 0.05, "token"),
}
