"""Simulated runs for the alarms, calibrated on measured ones (tests/test_alarms.py states the rates).

A run is seen as the trainer sees it: a raw reward mean per step (B*G = 64 completions, plus the
spread of the batch's prompts), greedy accuracy on 96 held-out prompts and 32 training prompts
(binomial noise) at the steps the schedule evaluates (grpo/run/run_state.py: from the planned steps
alone), the start (step 0) and the end included. Between evaluations the model itself wobbles: the
default `add` run's subset read 57%, 71%, 54%, 68% at steps 4, 8, 12, 16 while its full held-out
rose 16.4% -> 71.5%, and two-digit subtraction's read 2.3% -> 10.9% with dips while the full set
rose 5.5% -> 17.6% in 10 steps. The model's swing (grpo.observe.alarms.OVERDISPERSION: sd 5 points at 50%,
shared by both prompt sets) on top of the binomial noise gives dips of 15 points between evaluations
in about one pair in ten at 50% accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from grpo.config_resolution import alarm_window_for
from grpo.observe.alarm_monitor import AlarmMonitor
from grpo.observe.alarms import OVERDISPERSION, AlarmConfig
from grpo.run.run_state import planned_schedule

HELDOUT, TRAIN, COMPLETIONS, HELDOUT_ALL = 96, 32, 64, 256
BATCH_SPREAD = 0.04  # sd of a step's reward mean from which prompts the batch drew


@dataclass
class Curves:
    """True values at step t of s steps: held-out and train-sample accuracy, reward, first-try reward."""

    steps: int
    heldout: Callable[[int], float]
    train: Callable[[int], float]
    reward: Callable[[int], float]
    first_try: Callable[[int], float]
    signal: float = 0.7  # share of the batch's groups whose rewards differ
    budget: bool = False  # a --data run under --minutes: planned for 20 steps, run for ``steps`` (until time ran out)
    accuracy: Callable[[int], float] | None = None  # the checker's verdict on the sampled completions (the
    # trainer's `accuracy`); None: the reward is the checker, so it reads the reward's own completions


def _clip(p: float) -> float:
    return min(1.0, max(0.0, p))


def _measure(rng: np.random.Generator, p: float, n: int, swing: float) -> float:
    """Greedy accuracy on n prompts of a model whose true accuracy is p, swung by ``swing`` sds."""
    p = _clip(p)
    return rng.binomial(n, _clip(p + swing * math.sqrt(p * (1 - p) * OVERDISPERSION))) / n


def simulate(curves: Curves, seed: int, **thresholds: float) -> AlarmMonitor:
    """Feed one simulated run through the monitor as the trainer would; stop where it says stop."""
    rng = np.random.default_rng(seed)
    checked = np.random.default_rng((seed, 1))  # the checker's own draws, apart, so that the others stay as they were
    others = np.random.default_rng((seed, 2))  # the whole held-out set's prompts beyond the subset, likewise
    steps = curves.steps
    # under --minutes (a --data run: 100 steps at most, 10 minutes) the plan is 20 steps whatever runs
    every, planned = planned_schedule(100, 10.0) if curves.budget else planned_schedule(steps, 0.0)
    monitor = AlarmMonitor(100 if curves.budget else steps, AlarmConfig(
        **{"window": alarm_window_for(planned), "full_n": HELDOUT_ALL, **thresholds}))

    def evaluation(t: int, whole: bool = False) -> dict[str, float]:
        swing = rng.normal() if t else 0.0  # the start is the untrained model; later ones swing together
        out = {"heldout_subset_accuracy": _measure(rng, curves.heldout(t), HELDOUT, swing),
               "train_sample_accuracy": _measure(rng, curves.train(t), TRAIN, swing)}
        if whole:  # the start and the end score the whole held-out set, the subset among it
            rest = _measure(others, curves.heldout(t), HELDOUT_ALL - HELDOUT, swing)
            out["heldout_accuracy"] = (out["heldout_subset_accuracy"] * HELDOUT + rest * (HELDOUT_ALL - HELDOUT)) / HELDOUT_ALL
        return out

    raised: set[str] = set()

    def observe(t: int, m: dict[str, float], final: bool = False) -> None:
        monitor.observe(t, m, final=final)
        raised.update(name for name, on in monitor.active.items() if on)

    observe(0, evaluation(0, whole=True))
    monitor.stopped = None
    for t in range(1, steps + 1):
        p = _clip(curves.reward(t) + rng.normal(0, BATCH_SPREAD))
        m = {"reward_mean": rng.binomial(COMPLETIONS, p) / COMPLETIONS, "adv_nonzero_frac": curves.signal,
             "signal_frac": _clip(curves.signal + rng.normal(0, 0.05)), "completion_len": 10 + rng.normal(0, 0.3),
             "repeat_ngram_frac": 0.01, "entropy": 0.5,
             "reward_first_try": rng.binomial(16, _clip(curves.first_try(t))) / 16 if t % 2 else float("nan")}
        m["accuracy"] = m["reward_mean"] if curves.accuracy is None else \
            checked.binomial(COMPLETIONS, _clip(curves.accuracy(t))) / COMPLETIONS
        if t % every == 0 and t < steps:
            m.update(evaluation(t))
        observe(t, m)
        monitor.stopped = monitor.stopping()
        if monitor.stopped or t == steps:  # the final evaluation runs after a stop too
            observe(t, evaluation(t, whole=True), final=True)
            break
    monitor.raised = raised
    return monitor


def _linear(start: float, gain: float, steps: int, lag: int = 0) -> Callable[[int], float]:
    return lambda t: start + gain * max(0, t - lag) / max(steps - lag, 1)


def slow_learner(rng: np.random.Generator) -> Curves:
    """+10 to +15 held-out points over 10-20 steps, reward rising as much or a little more."""
    steps, h0 = int(rng.integers(10, 21)), rng.uniform(0.03, 0.5)
    gain, lag = rng.uniform(0.10, 0.15), int(rng.integers(0, 3))
    r0 = h0 + rng.uniform(0.0, 0.1)
    held = _linear(h0, gain, steps, lag)
    return Curves(steps, held, lambda t: held(t) + 0.02 * t / steps, _linear(r0, gain * rng.uniform(1, 1.5), steps, lag),
                  _linear(r0, gain, steps, lag))


def long_slow_learner(rng: np.random.Generator) -> Curves:
    """A --data run under --minutes on a fast machine, planned for 20 steps and run for 25-40, where a verdict
    can stop it (from the sixth evaluation, step 20): a slow learner's pace (+10 to +15 points per 10 to 20
    steps) kept up over the whole run, at most +40 points."""
    curves = slow_learner(rng)
    steps, h0 = int(rng.integers(25, 41)), curves.heldout(0)
    gain, r0 = min(0.4, steps * rng.uniform(0.10, 0.15) / rng.uniform(10, 20)), curves.reward(0)
    held = _linear(h0, gain, steps)
    return Curves(steps, held, lambda t: held(t) + 0.02 * t / steps, _linear(r0, gain * rng.uniform(1, 1.5), steps),
                  _linear(r0, gain, steps), budget=True)


def fast_learner(rng: np.random.Generator) -> Curves:
    """+30 to +55 points within 3-6 steps' time constant, then a plateau, 20 steps (the default run)."""
    steps, h0, gain, tau = 20, rng.uniform(0.1, 0.4), rng.uniform(0.3, 0.55), rng.uniform(3, 6)
    held = lambda t: h0 + gain * (1 - math.exp(-t / tau))  # noqa: E731
    r0, r_gain = rng.uniform(0.2, 0.4), rng.uniform(0.4, 0.6)
    reward = lambda t: min(0.95, r0 + r_gain * (1 - math.exp(-t / tau)))  # noqa: E731
    return Curves(steps, held, held, reward, reward)


def stalled(rng: np.random.Generator) -> Curves:
    """Held-out and train-sample flat; reward flat or rising a little (the sampler's easier prompts)."""
    steps, h0, r0 = int(rng.integers(10, 21)), rng.uniform(0.03, 0.5), rng.uniform(0.1, 0.6)
    flat = lambda t: h0  # noqa: E731
    reward = _linear(r0, rng.uniform(0.0, 0.05), steps)
    return Curves(steps, flat, flat, reward, reward)


def gamed_checker(rng: np.random.Generator) -> Curves:
    """Reward rising 0.3 to 0.6 while the checker's accuracy stays flat on held-out and training prompts."""
    steps, h0, r0 = int(rng.integers(10, 21)), rng.uniform(0.03, 0.5), rng.uniform(0.05, 0.3)
    flat = lambda t: h0  # noqa: E731
    reward = _linear(r0, rng.uniform(0.3, 0.6), steps)
    checked = h0 * rng.uniform(0.6, 1.0)  # what the checker passes of the samples: no more than greedy, and flat
    return Curves(steps, flat, flat, reward, reward, accuracy=lambda t: checked)


def no_signal(rng: np.random.Generator) -> Curves:
    """Almost nothing solved: few groups whose rewards differ."""
    steps, h0 = int(rng.integers(10, 21)), rng.uniform(0.0, 0.03)
    flat = lambda t: h0  # noqa: E731
    return Curves(steps, flat, flat, flat, flat, signal=rng.uniform(0.02, 0.15))


def memorising(rng: np.random.Generator) -> Curves:
    """Train-sample accuracy rising 20-40 points with the reward while held-out is flat or falls 5."""
    steps, h0 = int(rng.integers(10, 21)), rng.uniform(0.05, 0.4)
    gain = rng.uniform(0.2, 0.4)
    held = _linear(h0, -rng.uniform(0.0, 0.05), steps)
    train = _linear(h0, gain, steps)
    return Curves(steps, held, train, _linear(h0 + 0.05, gain, steps), lambda t: h0)


def sharpening_learner(rng: np.random.Generator) -> Curves:
    """A --data run under --minutes (planned for 20 steps, run for 21-40) on an easy file, as the 144-row
    times table that raised checker_suspected at step 35 (raw reward +0.319, held-out greedy 71.7% -> 81.7%,
    training sample 84.4% -> 96.9%): greedy accuracy high and rising 5 to 12 points on held-out and training
    prompts alike, while the sampled reward, which starts 0.2 to 0.35 below the greedy training accuracy,
    closes most of that gap as the policy sharpens (its entropy falls), with no new ability."""
    steps, h0, gain = int(rng.integers(21, 41)), rng.uniform(0.5, 0.8), rng.uniform(0.05, 0.12)
    g0 = min(h0 + rng.uniform(0.0, 0.15), 0.85)
    gap0 = rng.uniform(0.2, 0.35)
    gap1 = gap0 * rng.uniform(0.2, 0.6)
    held, train = _linear(h0, gain, steps), _linear(g0, gain, steps)
    reward = lambda t: train(t) - gap0 + (gap0 - gap1) * t / steps  # noqa: E731
    return Curves(steps, held, train, reward, reward, budget=True)


def frontier_learner(rng: np.random.Generator) -> Curves:
    """A --data run under --minutes (planned for 20 steps, run for 21-40) drawing at the frontier, as the
    subtraction run that raised stall at step 26 (subset 3.1% -> 13.5%, full held-out 5.5% -> 17.2%, raw
    reward +0.037): greedy accuracy rising 10 to 15 points on held-out and training prompts, while the
    sampler moves to harder prompts as the model learns, so the reward of the prompts it draws stays flat
    (-0.03 to +0.05). Its first tries are the uniform draws among them: they follow the held-out accuracy."""
    steps, h0, gain = int(rng.integers(21, 41)), rng.uniform(0.03, 0.3), rng.uniform(0.10, 0.15)
    held = _linear(h0, gain, steps)
    reward = _linear(rng.uniform(0.15, 0.4), rng.uniform(-0.03, 0.05), steps)
    return Curves(steps, held, held, reward, held, budget=True)


LEARNERS = {"slow": slow_learner, "fast": fast_learner, "slow_budget": long_slow_learner}
# learners in the shapes of two reported false warnings (issue 34, item 16), counted like learners but held
# to no target: at these sizes many of them cannot be told from a stall (bench/README.md)
REPORTED = {"sharpening": sharpening_learner, "frontier": frontier_learner}
FAILURES = {"stall": (stalled, ("stall", "checker_suspected")), "checker": (gamed_checker, ("checker_suspected",)),
            "no_signal": (no_signal, ("no_signal",)), "memorising": (memorising, ("memorising",))}


def runs(kind: Callable[[np.random.Generator], Curves], n: int = 40, seed: int = 0,
         **thresholds: float) -> list[AlarmMonitor]:
    """n simulated runs of one kind, each with its own curves and noise."""
    return [simulate(kind(np.random.default_rng((seed, i))), 1000 * seed + i, **thresholds) for i in range(n)]


def rates(n: int = 40, seed: int = 0, **thresholds: float) -> dict[str, tuple[int, int]]:
    """For learners: (runs warned by a stopping alarm, runs stopped); for failures: (caught, stopped)."""
    out = {}
    for name, kind in {**LEARNERS, **REPORTED}.items():
        monitors = runs(kind, n, seed, **thresholds)
        out[name] = (sum(bool(m.raised) for m in monitors),
                     sum(m.stopped is not None for m in monitors))
    for name, (kind, alarms) in FAILURES.items():
        monitors = runs(kind, n, seed, **thresholds)
        out[name] = (sum(bool(m.raised & set(alarms)) for m in monitors),
                     sum(m.stopped is not None for m in monitors))
    return out


if __name__ == "__main__":  # bench/README.md's table: seed 0, and the sums over seeds 0-4
    totals: dict[str, tuple[int, int]] = {}
    for seed in range(5):
        measured = rates(seed=seed)
        print(seed, measured, flush=True)
        totals = {k: (totals.get(k, (0, 0))[0] + a, totals.get(k, (0, 0))[1] + b) for k, (a, b) in measured.items()}
    print("seeds 0-4", totals)
