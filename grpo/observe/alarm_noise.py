"""The alarms' noise model: a series' change is its least-squares line's change across it (slope times
span, less noisy than last-minus-first), set against that change's standard deviation; an accuracy's
noise is binomial on its prompts and overdispersed, a reward's is read from its residuals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Greedy accuracy on a fixed prompt set moves between evaluations by more than its binomial noise: the
# model itself swings (the default run's 128-prompt subset read 57%, 71%, 54%, 68% while it learned).
# Variance p(1-p)(1/n + OVERDISPERSION): at 50% a swing of sd 5 points on top of the binomial's.
OVERDISPERSION = 0.01

Series = Sequence[tuple[int, float]]  # (step, accuracy) measurements, the start (step 0) first


def fitted_change(values: Sequence[float], steps: Sequence[float] | None = None) -> float:
    """Change across the series of its least-squares line (NaNs dropped); 0 for fewer than 2 points.
    ``steps``: where each value was measured (default 0, 1, 2, ...)."""
    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float) if steps is None else np.asarray(steps, dtype=float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(y) < 2 or x[-1] == x[0]:
        return 0.0
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))


def change_sd(steps: Sequence[float], sd: float) -> float:
    """Standard deviation of the fitted change across ``steps`` of values with independent noise ``sd``."""
    x = np.asarray(steps, dtype=float)
    sxx = float(((x - x.mean()) ** 2).sum())
    return sd * float(x[-1] - x[0]) / math.sqrt(sxx) if sxx > 0 else math.inf


def accuracy_change(series: Series, n: int) -> tuple[float, float]:
    """An accuracy series' fitted change across the steps it was measured at, and that change's sd
    under the noise model (binomial on n prompts, overdispersed; at the series' mean level)."""
    steps, values = [s for s, _ in series], [a for _, a in series]
    p = min(max(float(np.mean(values)), 0.02), 0.98)
    return fitted_change(values, steps), change_sd(steps, math.sqrt(p * (1 - p) * (1 / n + OVERDISPERSION)))


def reward_change(values: Sequence[float]) -> tuple[float, float]:
    """The reward's fitted change over the run and its sd, from the residuals around its line."""
    y = np.asarray(values, dtype=float)
    y = y[np.isfinite(y)]
    n = len(y)
    if n < 3:
        return fitted_change(y), math.inf
    x = np.arange(n, dtype=float)
    residuals = y - np.polyval(np.polyfit(x, y, 1), x)
    sigma = float(np.sqrt((residuals**2).sum() / (n - 2)))
    return fitted_change(y), max(change_sd(x, sigma), 1e-6)
