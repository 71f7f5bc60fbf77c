"""Alarms over the metric stream: no signal, checker suspected, stall, memorising, suspected reward
hacking, entropy collapse.

Advantages are relative within a group, so the objective never sees whether
typical reward is rising: a run can look busy while the policy stalls, and a
policy that games its checker looks like one that learns. These checks look
at absolute quantities instead: the raw reward, greedy accuracy on a fixed
subset of held-out prompts and on a fixed sample of training prompts, each
scored every few steps (grpo/observe/heldout.py). Each is a pure function of metric
series; ``AlarmMonitor`` (grpo/observe/alarm_monitor.py) keeps the history, runs them after every step and
reports an alarm when it turns on.

The verdicts on learning (stall, checker suspected, memorising) read the run
since its start, not a trailing window: a run that learned and then plateaued
has learned. A change is the least-squares line's change across the series
(slope times span), less noisy than last-minus-first. Accuracies are read at
the steps they were measured, so the verdict depends on which steps were
evaluated, never on how fast the machine ran them (the schedule is a function
of the planned steps: grpo/run/run_state.py). The thresholds were set on the
simulation in tests/test_alarms.py, calibrated on measured runs (held-out
subsets of 96 prompts with binomial noise and dips of 15 points between
evaluations; slow learners that gain 10 to 15 points; fast learners that
plateau); bench/README.md states the error rates it measures.

``STOPPING`` alarms end the run early when ``early_stop`` is on: they say
that further steps will not raise held-out accuracy. ``NOTES`` (slow progress) are said as the verdicts
are, but are no alarm: no flag, no stop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from grpo.observe.alarm_noise import OVERDISPERSION, Series, accuracy_change, fitted_change, reward_change

ALARMS = ("no_signal", "checker_suspected", "stall", "memorising", "length_without_reward",
          "repetition_rising", "entropy_collapse", "divergence_rising")
STOPPING = ("no_signal", "checker_suspected", "stall", "memorising")
TRENDS = ("checker_suspected", "stall", "memorising")  # verdicts on learning, taken at held-out evaluations
NOTES = ("slow_progress",)  # said as the trend verdicts are, but no alarm: never a flag, never a stop
MEMORISED_GAP = 0.1  # mean reward above the first tries' by more than this: a hint of memorising
MEMORISE_REPEATS = 0.2  # memorising needs repeats: the recent steps' mean share of groups at a prompt drawn before
WARN_AFTER = 2  # a trend verdict is raised once some trend verdict held at this many evaluations in a row
CONFIRM = 2  # ... and stops the run once one has held at this many
MIN_EVALUATIONS = 5  # verdicts on learning need the start and four evaluations after it


@dataclass(frozen=True)
class AlarmConfig:
    """Thresholds, on rewards and accuracies in [0, 1]; z: a change over its modelled noise."""

    window: int = 20  # steps before a verdict on learning; trailing steps the hacking trends are measured over
    heldout_n: int = 96  # prompts in the held-out subset (its binomial noise)
    full_n: int = 0  # prompts in the whole held-out set, scored at the start and the end (0: not known)
    train_n: int = 32  # prompts in the training sample
    stall_z: float = 3.0  # stall: reward's z plus held-out's (plus training sample's) under this ...
    heldout_rise_z: float = 2.0  # ... unless held-out accuracy alone rose by this many of its sds
    heldout_noise_z: float = 1.0  # held-out accuracy that rose by this many sds, but less: "slow progress"
    adv_nonzero_min: float = 0.1  # "advantages non-zero": at least this fraction on average
    checker_rise: float = 0.1  # checker/memorising: raw reward rising by more than this (and twice its noise) ...
    checker_follow: float = 0.6  # ... while held-out accuracy falls short of this share of it ...
    follow_z: float = -1.25  # ... by this many of its sd (z below this)
    train_follow: float = 0.4  # memorising, not the checker: the training sample rose by this share of it
    reward_rise: float = 0.05  # raw reward rising (length alarm): change above this
    length_rise: float = 0.2  # completion length growing: relative change above this (and >= 1 token)
    repetition_rise: float = 0.1  # repeated n-gram fraction rising: change above this
    entropy_floor: float = 0.05  # nats per token; below it early in training is a collapse
    early_frac: float = 0.25  # "early": the first quarter of the run
    no_signal_steps: int = 5  # steps in a row with too little signal before the no-signal alarm
    signal_min: float = 0.25  # "too little signal": under this share of the batch's groups vary
    sampler: str = "frontier"  # the run's prompt sampler: the advice on memorising names the other one


def _measured(series: Series) -> list[tuple[int, float]]:
    return [(s, a) for s, a in series if math.isfinite(a)]


def _describe(name: str, series: Series) -> str:
    return f"{name} {series[0][1]:.1%} -> {series[-1][1]:.1%}" if len(series) >= 2 else ""


def _rising(d_reward: float, sd_reward: float, floor: float) -> bool:
    return d_reward > max(floor, 2.0 * sd_reward)


def stall(reward: Sequence[float], adv_nonzero: Sequence[float], heldout: Series, train: Series,
          cfg: AlarmConfig, first_try: Sequence[float] = (), full: Series = ()) -> str | None:
    """Since the start, the run not improving while advantages are non-zero: the raw reward's change
    and greedy accuracy's, on the held-out subset and on the training sample, each over its noise (z),
    sum to under ``stall_z``. A reward that rises while accuracy stays flat is a stall too (the sampler
    moving to easier prompts); checker_suspected or memorising may name it better. Falling is no
    better than flat. But held-out accuracy that rose by ``heldout_rise_z`` of its sds on its own (on the
    subset's line, or from the start to the final evaluation of the whole held-out set, ``full``) is
    learning: a sampled reward says less than that (the frontier sampler moves to harder prompts as the
    model learns and holds the reward of its draws flat). Held-out accuracy that rose by
    ``heldout_noise_z`` sds, if not by ``heldout_rise_z``, is no stall either: ``slow_progress`` says so."""
    seen = _flat(reward, adv_nonzero, heldout, train, cfg, full)
    if seen is None or seen[0] >= cfg.heldout_noise_z:
        return None
    return "stall: " + _what_was_seen(reward, heldout, train, (), seen[1]) + _memorised_hint(reward, first_try, cfg)


def slow_progress(reward: Sequence[float], adv_nonzero: Sequence[float], heldout: Series, train: Series,
                  cfg: AlarmConfig, full: Series = ()) -> str | None:
    """A note, never a stop: the stall rule's sum under ``stall_z``, but held-out accuracy risen beyond its
    noise (``heldout_noise_z`` sds, on the subset's line or the whole set's ends), if not by the
    ``heldout_rise_z`` that counts as learning on its own. Issue 52, item 15: 15 steps on short-answer
    questions warned "stall" with held-out accuracy 0.0% -> 5.2% in its own message."""
    seen = _flat(reward, adv_nonzero, heldout, train, cfg, full)
    if seen is None or seen[0] < cfg.heldout_noise_z:
        return None
    held_z, signal = seen
    return (f"slow progress: held-out accuracy rose by {math.floor(held_z * 100) / 100:.2f} sd of its noise, "
            f"under the {cfg.heldout_rise_z:g} that would count as learning on its own; "
            + _what_was_seen(reward, heldout, train, full, signal))


def _flat(reward: Sequence[float], adv_nonzero: Sequence[float], heldout: Series, train: Series,
          cfg: AlarmConfig, full: Series) -> tuple[float, float] | None:
    """Where the run's changes over their noise sum to under ``stall_z`` while advantages are non-zero and
    held-out accuracy alone did not rise by ``heldout_rise_z``: held-out accuracy's z (the larger of the
    subset's line and the whole set's ends) and the share of non-zero advantages; else None."""
    heldout, train = _measured(heldout), _measured(train)
    if len(reward) < cfg.window or len(heldout) < MIN_EVALUATIONS:
        return None
    d_reward, sd_reward = reward_change(reward)
    signal = float(np.nanmean(adv_nonzero)) if np.isfinite(adv_nonzero).any() else 0.0
    if not signal >= cfg.adv_nonzero_min:
        return None
    d_held, sd_held = accuracy_change(heldout, cfg.heldout_n)
    held_z = max(d_held / sd_held, _whole_set_z(full, heldout, cfg))
    if held_z >= cfg.heldout_rise_z:
        return None
    z = d_reward / sd_reward + d_held / sd_held
    if len(train) >= MIN_EVALUATIONS:
        d_train, sd_train = accuracy_change(train, cfg.train_n)
        z += d_train / sd_train
    return (held_z, signal) if z < cfg.stall_z else None


def _what_was_seen(reward: Sequence[float], heldout: Series, train: Series, full: Series, signal: float) -> str:
    heldout, train, full = _measured(heldout), _measured(train), _measured(full)
    trained = f", {_describe('training sample', train)}" if len(train) >= 2 else ""
    whole = f", {_describe('whole held-out set', full)}" if len(full) >= 2 else ""
    return (f"raw reward changed {reward_change(reward)[0]:+.3f} over {len(reward)} steps, "
            f"{_describe('held-out accuracy', heldout)}{whole}{trained}, while {signal:.0%} of advantages are "
            "non-zero")


def _memorised_hint(reward: Sequence[float], first_try: Sequence[float], cfg: AlarmConfig) -> str:
    tried = [x for x in first_try if math.isfinite(x)]
    memorised = len(tried) >= 3 and float(np.nanmean(reward)) - float(np.mean(tried)) > MEMORISED_GAP
    return f". {_divergence_cause(reward, tried, cfg)}" if memorised else ""


def _whole_set_z(full: Series, heldout: Series, cfg: AlarmConfig) -> float:
    """The whole held-out set's change from the start to now over its noise, where it was scored now (the
    final evaluation) and is larger than the subset; else -inf."""
    full = _measured(full)
    if len(full) < 2 or cfg.full_n <= cfg.heldout_n or full[-1][0] != heldout[-1][0] or full[0][0] != heldout[0][0]:
        return -math.inf
    (_, start), (_, end) = full[0], full[-1]
    p = min(max((start + end) / 2, 0.02), 0.98)
    return (end - start) / math.sqrt(2 * p * (1 - p) * (1 / cfg.full_n + OVERDISPERSION))


def no_signal(signal: Sequence[float], cfg: AlarmConfig) -> str | None:
    """Most of the batch uninformative (groups whose rewards are all equal) for several steps in a row."""
    recent = signal[-cfg.no_signal_steps :]
    if len(recent) < cfg.no_signal_steps or not all(s < cfg.signal_min for s in recent):
        return None
    return (f"no signal: in each of the last {len(recent)} steps under {cfg.signal_min:.0%} of the batch's groups "
            f"had rewards that differ (latest {recent[-1]:.0%}), so the updates learn next to nothing. The model "
            "solves almost none (or almost all) of these prompts: try a stronger model, easier data, a longer "
            "--max-new-tokens, or a reward with partial credit")


def little_signal(signal: Sequence[float], raised: Sequence[str], cfg: AlarmConfig) -> str | None:
    """The end of a run that trained on (next to) nothing, in one line, where ``no_signal`` did not fire
    (a run shorter than its ``no_signal_steps``, or one whose few varying steps broke its count): the
    steps' mean share of varying groups (``signal_frac``) under the alarm's own ``signal_min``."""
    if not signal or "no_signal" in raised or float(np.mean(signal)) >= cfg.signal_min:
        return None
    varied = sum(s > 0 for s in signal)
    return (f"little signal: {varied or 'none'} of the {len(signal)} steps trained on a group whose rewards "
            f"differ (on average {float(np.mean(signal)):.0%} of the batch's groups), so next to nothing was "
            "learned; what to do: docs/alarms.md, no_signal")


def _line_ends(values: Sequence[float], steps: Sequence[float]) -> tuple[float, float]:
    """The least-squares line's values at the first and the last of ``steps``."""
    slope, intercept = np.polyfit(np.asarray(steps, dtype=float), np.asarray(values, dtype=float), 1)
    return float(intercept + slope * steps[0]), float(intercept + slope * steps[-1])


def sharpening(reward: Sequence[float], accuracy: Sequence[float], train: Series, train_n: int) -> float:
    """The part of the raw reward's rise that sharpening explains, 0 where it explains none.

    A sampled reward moves with the policy's entropy, a greedy accuracy does not: a policy that sharpens
    raises its sampled accuracy towards its greedy one with no new ability (a times-table run: sampled
    reward +0.319 while greedy accuracy rose 10 points on held-out prompts and 12.5 on training ones). So
    the rise counted is the checker's verdict on the sampled completions (``accuracy``, per step) closing
    its gap below the checker's greedy verdict on the training sample: the gap's shrinking, at most the
    sampled accuracy's own rise (a reward the checker does not follow closes nothing), at most the
    reward's. Each level is read off its least-squares line at the series' ends, and the shrinking is
    counted less half an sd of the training sample's fitted change (its noise: 32 prompts), so that a gap
    that only seems to close is seldom taken for sharpening (on tests/alarm_simulation.py's 200 runs of
    each kind: with nothing taken off, 2 memorising runs fewer were caught; with a whole sd, 80 sharpening
    runs were warned, against 61 with half)."""
    acc = np.asarray(accuracy, dtype=float)
    at = np.flatnonzero(np.isfinite(acc))
    if len(at) < 3 or len(train) < MIN_EVALUATIONS:
        return 0.0
    a0, a1 = _line_ends(acc[at], at)
    g0, g1 = _line_ends([a for _, a in train], [s for s, _ in train])
    closed = max(g0 - a0, 0.0) - max(g1 - a1, 0.0) - 0.5 * accuracy_change(train, train_n)[1]
    return float(min(max(min(closed, a1 - a0), 0.0), max(reward_change(reward)[0], 0.0)))


def _reward_outruns_heldout(reward: Sequence[float], heldout: Series, cfg: AlarmConfig,
                            sharpened: float = 0.0) -> float | None:
    """The reward's change less ``sharpened`` (what sharpening explains), when that rises beyond the
    reward's noise while held-out accuracy falls short of ``checker_follow`` of it by more than
    ``-follow_z`` sds; else None."""
    if len(reward) < cfg.window or len(heldout) < MIN_EVALUATIONS:
        return None
    d_reward, sd_reward = reward_change(reward)
    rise = d_reward - sharpened
    if not _rising(rise, sd_reward, cfg.checker_rise):
        return None
    d_held, sd_held = accuracy_change(heldout, cfg.heldout_n)
    return rise if (d_held - cfg.checker_follow * rise) / sd_held < cfg.follow_z else None


def _train_follows(train: Series, rise: float, cfg: AlarmConfig) -> bool:
    """Greedy accuracy on the training sample rose by at least ``train_follow`` of the reward's rise."""
    return len(train) >= MIN_EVALUATIONS and accuracy_change(train, cfg.train_n)[0] >= cfg.train_follow * rise


def _reward_rise(reward: Sequence[float], sharpened: float) -> str:
    d_reward = reward_change(reward)[0]
    said = f"raw training reward {d_reward:+.3f} over {len(reward)} steps"
    return said + (f" ({sharpened:+.3f} of it sharpening: the sampled completions closing on greedy accuracy)"
                   if sharpened > 0 else "")


def checker_suspected(reward: Sequence[float], heldout: Series, train: Series, cfg: AlarmConfig,
                      first_try: Sequence[float] = (), accuracy: Sequence[float] = ()) -> str | None:
    """Since the start, training reward rising, beyond what sharpening explains (``accuracy``: the
    checker's verdict on the sampled completions, see ``sharpening``), while greedy accuracy by the task's
    checker follows it neither on held-out prompts nor on the training sample (where measured): the reward
    pays for something the checker does not."""
    heldout, train = _measured(heldout), _measured(train)
    sharpened = sharpening(reward, accuracy, train, cfg.train_n)
    rise = _reward_outruns_heldout(reward, heldout, cfg, sharpened)
    if rise is None or _train_follows(train, rise, cfg):
        return None
    trained = f", {_describe('training sample', train)}" if len(train) >= 2 else ""
    return (f"checker suspected: {_reward_rise(reward, sharpened)} while "
            f"{_describe('held-out accuracy', heldout)}{trained}. {_divergence_cause(reward, first_try, cfg)}")


def memorising(reward: Sequence[float], heldout: Series, train: Series, cfg: AlarmConfig,
               first_try: Sequence[float] = (), accuracy: Sequence[float] = (),
               repeats: Sequence[float] = ()) -> str | None:
    """Training reward rising beyond what sharpening explains (``sharpening``), greedy accuracy on the fixed
    training sample rising with it, and held-out accuracy not following: the train/held-out gap grows while held-out is flat or falling, so the
    policy learns the training prompts' answers, not the task. Measured on the training sample; the
    first-try reward only adds a hint to the message.

    Memorising needs repeats: where the recent steps' groups (``repeats``, each step's share of groups at
    a prompt drawn before, over the trailing window; step 1 always 0) were mostly first tries, averaging
    under MEMORISE_REPEATS (a large file drawn uniformly), the policy has seen the training sample's
    prompts about as rarely as the held-out ones, so a gap between the two is their noise, not
    memorising: no verdict. A proxy: the share of draws that repeat, not the training sample's own."""
    seen = [x for x in repeats if math.isfinite(x)]
    if seen and float(np.mean(seen)) < MEMORISE_REPEATS:
        return None
    heldout, train = _measured(heldout), _measured(train)
    sharpened = sharpening(reward, accuracy, train, cfg.train_n)
    rise = _reward_outruns_heldout(reward, heldout, cfg, sharpened)
    if rise is None or not _train_follows(train, rise, cfg):
        return None
    tried = [x for x in first_try if math.isfinite(x)]
    hint = ""
    if len(tried) >= 3:
        hint = (f" (reward on prompts tried for the first time {float(np.mean(tried)):.2f} against "
                f"{float(np.nanmean(reward)):.2f} overall)")
    return (f"memorising: {_describe('greedy accuracy on the training sample', train)} while "
            f"{_describe('held-out accuracy', heldout)}, {_reward_rise(reward, sharpened)}{hint}: the policy learns the "
            f"training prompts' answers, not the task. {_memorising_advice(cfg)}")


def _memorising_advice(cfg: AlarmConfig) -> str:
    """What to try against memorising: uniform draws only where the run does not already use them."""
    if cfg.sampler == "uniform":
        return "Try more training prompts or a lower --lr"
    return "Try more training prompts, --sampler uniform, or a lower --lr"


def _divergence_cause(reward: Sequence[float], first_try: Sequence[float], cfg: AlarmConfig) -> str:
    """Why training reward runs ahead of held-out accuracy, read from the reward on first tries at a prompt.

    A hole in the reward pays on any prompt, first try or not; memorising pays only on prompts drawn
    before. So the run's mean reward on first tries is compared with its mean reward overall: levels,
    not trends, because a step holds only a few first tries and their trend is mostly noise. A hint
    in the message, never a trigger (the memorising alarm measures the training sample).
    """
    tried = [x for x in first_try if math.isfinite(x)]
    if len(tried) < 3:
        return ("The policy is learning something the held-out checker does not reward: a hole in the training "
                "reward, or only the sampler moving to easier prompts; audit it with grpo check-reward")
    first, overall = float(np.mean(tried)), float(np.nanmean(reward))
    if overall - first > MEMORISED_GAP:
        return (f"Its reward on prompts tried for the first time averaged {first:.2f} against {overall:.2f} "
                "overall: the reward comes from prompts drawn before, which hints at memorising the training "
                f"prompts the sampler keeps returning. {_memorising_advice(cfg)}")
    return (f"Its reward on prompts tried for the first time averaged {first:.2f}, as high as overall "
            f"({overall:.2f}), so it is not memorising: the training reward pays for something the held-out "
            "checker does not (audit it with grpo check-reward), or the held-out prompts differ from the "
            "training prompts")


def length_without_reward(length: Sequence[float], reward: Sequence[float], cfg: AlarmConfig) -> str | None:
    """Completion length growing while raw reward does not."""
    if len(length) < cfg.window:
        return None
    d_len, d_reward = fitted_change(length), fitted_change(reward)
    base = max(float(np.nanmean(length[: max(1, len(length) // 4)])), 1.0)
    if d_len >= max(1.0, cfg.length_rise * base) and d_reward <= cfg.reward_rise:
        return (f"suspected reward hacking: completion length {d_len:+.1f} tokens ({d_len / base:+.0%}) "
                f"over {len(length)} steps while raw reward changed {d_reward:+.3f}")
    return None


def repetition_rising(repetition: Sequence[float], cfg: AlarmConfig) -> str | None:
    """The fraction of repeated n-grams in completions rising."""
    if len(repetition) < cfg.window:
        return None
    d_rep = fitted_change(repetition)
    if d_rep > cfg.repetition_rise:
        return f"suspected reward hacking: repeated n-gram fraction {d_rep:+.2f} over {len(repetition)} steps"
    return None


def entropy_collapse(entropy: Sequence[float], step: int, total_steps: int, cfg: AlarmConfig) -> str | None:
    """Policy entropy below the floor during the first ``early_frac`` of training."""
    recent = [e for e in entropy[-3:] if math.isfinite(e)]
    if not recent or step > cfg.early_frac * total_steps:
        return None
    level = float(np.mean(recent))
    if level < cfg.entropy_floor:
        return (f"entropy collapse: policy entropy {level:.3f} nats/token at step {step} of {total_steps} "
                f"(floor {cfg.entropy_floor})")
    return None
