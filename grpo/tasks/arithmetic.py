"""Procedural arithmetic with answer-only replies: the default task.

"What is 23 + 45? Reply with only the number." The embedded SmolLM2-135M
answers such prompts with a sentence ("23 + 45 = 68") about 99% of the time,
so it starts near 0% held-out accuracy under the strict answer-only reward,
and GRPO has to teach both the format and the sum. Every (a, b) pair is
enumerated and split once with a fixed seed, so train and held-out prompts
are disjoint whatever the run's seed.
"""

from __future__ import annotations

import random

from grpo.rewards.basic import final_number
from grpo.tasks.base import Task, register

_SPLIT_SEED = 1234


def _split(pairs: list[tuple[int, int]], heldout_size: int) -> tuple[list, list]:
    rng = random.Random(_SPLIT_SEED)
    pairs = pairs[:]
    rng.shuffle(pairs)
    return pairs[heldout_size:], pairs[:heldout_size]


def _rows(pairs: list[tuple[int, int]], op: str) -> list[dict]:
    value = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}[op]
    return [
        {"prompt": f"What is {a} {op} {b}? Reply with only the number.", "answer": str(value(a, b))}
        for a, b in pairs
    ]


@register("add")
def two_digit_addition(heldout_size: int = 256) -> Task:
    """a + b with a, b in 10..99 (8,100 pairs)."""
    train, heldout = _split([(a, b) for a in range(10, 100) for b in range(10, 100)], heldout_size)
    return Task("add", _rows(train, "+"), _rows(heldout, "+"), final_number)
