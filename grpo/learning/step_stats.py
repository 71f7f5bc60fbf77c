"""What the update of one step measured (grpo/learning/update.py): its token-weighted means, summed over
every process's micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.system.distributed import World

TIS_KEYS = ("sampler_logp_diff", "sampler_kl", "tis_capped_frac", "tis_masked_tokens")  # the mismatch, per step
MEAN_KEYS = ("ratio_mean", "clip_frac_low", "clip_frac_high", "kl", "entropy", *TIS_KEYS)  # token-weighted
TEACHER_KEYS = ("teacher_kl", "teacher_disagree_frac")  # token-weighted, in a run with a teacher only


@dataclass
class StepStats:
    """What the update of one step measured (token-weighted means)."""

    loss: float = 0.0
    ratio_mean: float = 1.0
    clip_frac_low: float = 0.0
    clip_frac_high: float = 0.0
    kl: float = 0.0
    entropy: float = float("nan")
    grad_norm: float = 0.0
    optimizer_steps: int = 0
    nonfinite_skipped: int = 0
    trained_sequences: int = 0
    sampler_logp_diff: float = 0.0  # mean |log pi_trainer - log pi_sampler| over the tokens trained
    sampler_logp_diff_max: float = 0.0  # its largest value over the step's tokens trained
    sampler_kl: float = 0.0  # k3 estimate of KL(pi_sampler || pi_trainer)
    tis_capped_frac: float = 0.0  # share of tokens whose TIS weight was capped (or masked, sequence level)
    tis_masked_tokens: float = 0.0  # share of tokens whose weight a mask set to 0 (tis_mode mask, sequence level)
    tis_masked_sequences: float = 0.0  # share of the completions trained with a masked token
    teacher_kl: float | None = None  # mean log p - log p_teacher at the tokens trained; the full form: its exact
    # divergence (None: no teacher)
    teacher_disagree_frac: float | None = None  # share of them whose teacher's most likely token differs


@dataclass(frozen=True)
class MicroResult:
    """What one micro-step of the update measured (grpo/learning/update.py ``micro_step``), for the step's sums."""

    loss: float  # the micro-batch's loss, as backpropagated
    weight: float  # its tokens in the loss: the weight of its token means
    metrics: dict[str, float]  # each token mean of the loss, the teacher's term and TIS, times ``weight``
    entropy: float  # the entropy summed over its tokens in the loss
    trained_sequences: int  # its rows
    logp_diff_max: float | None = None  # the largest |log pi_trainer - log pi_sampler| (None: no TIS)
    sequences: float | None = None  # its completions with a token in the loss (None: no TIS)
    masked_sequences: float | None = None  # of them, those with a masked token (the share times ``sequences``)


def add_micro(sums: dict[str, float], stats: StepStats, micro: MicroResult) -> None:
    """Add one micro-step's record into the step's ``sums`` and ``stats.trained_sequences``; called for each
    micro-step in the order they run, so that every float sum adds in that order."""
    if micro.logp_diff_max is not None:  # a maximum, not a token-weighted mean
        sums["logp_diff_max"] = max(sums.get("logp_diff_max", 0.0), micro.logp_diff_max)
    if micro.sequences is not None:  # a share of completions, weighted by them
        sums["sequences"] = sums.get("sequences", 0.0) + micro.sequences
        sums["masked_sequences"] = sums.get("masked_sequences", 0.0) + micro.masked_sequences
    sums["weight"] += micro.weight
    sums["loss"] = sums.get("loss", 0.0) + micro.loss
    for k, v in micro.metrics.items():
        sums[k] = sums.get(k, 0.0) + v
    sums["entropy"] = sums.get("entropy", 0.0) + micro.entropy
    stats.trained_sequences += micro.trained_sequences


def whole_batch_stats(world: World, stats: StepStats, sums: dict, *, teacher: bool = False) -> StepStats:
    """The step's token-weighted means over every process's micro-batches (``teacher``: the teacher's too)."""
    keys = ("loss", *MEAN_KEYS, *TEACHER_KEYS, "sequences", "masked_sequences")
    totals = world.sum(torch.tensor(
        [sums["weight"], stats.trained_sequences, *(sums.get(k, 0.0) for k in keys)], dtype=torch.float64))
    weight, stats.trained_sequences = float(totals[0]), int(totals[1])
    stats.sampler_logp_diff_max = max(world.gather_objects(sums.get("logp_diff_max", 0.0)))
    summed = dict(zip(keys, totals[2:].tolist(), strict=True))  # whole-batch sums over processes
    if weight > 0:
        stats.loss = summed["loss"] / max(stats.optimizer_steps, 1)
        for key in (*MEAN_KEYS, *(TEACHER_KEYS if teacher else ())):
            setattr(stats, key, summed[key] / weight)
        stats.tis_masked_sequences = summed["masked_sequences"] / max(summed["sequences"], 1.0)
    return stats
