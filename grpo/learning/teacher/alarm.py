"""The distillation alarm, ``divergence_rising`` (a warning, read by grpo/observe/alarm_monitor.py): the
student's divergence from its teacher, ``teacher_kl``, rising over the alarm window. Distillation should
bring it down; a rise means the student is moving away from the teacher it learns from (a reward pulling
the other way, a learning rate too high, or a teacher scoring prompts it was not trained on)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DIVERGENCE_RISE = 0.25  # a fitted rise over the window above this share of the fitted start raises it
DIVERGENCE_FLOOR = 0.01  # ... and above this many nats per token (a rise of a divergence near 0 is noise)


def divergence_rising(teacher_kl: Sequence[float], window: int) -> str | None:
    """The warning when the least-squares line through the last ``window`` steps' teacher_kl rises by
    more than DIVERGENCE_RISE of its start (and DIVERGENCE_FLOOR nats); None otherwise, or with no teacher
    (no teacher_kl logged)."""
    values = [v for v in teacher_kl[-window:] if math.isfinite(v)]
    if len(values) < window or window < 2:
        return None
    slope, start = np.polyfit(np.arange(len(values)), values, 1)
    rise = float(slope) * (len(values) - 1)
    if rise > max(DIVERGENCE_RISE * abs(float(start)), DIVERGENCE_FLOOR):
        return (f"divergence rising: teacher_kl {float(start):.3f} -> {float(start) + rise:.3f} nats per token over "
                f"{len(values)} steps: the student is moving away from its teacher")
    return None
