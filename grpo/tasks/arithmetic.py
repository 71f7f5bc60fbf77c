"""Procedural arithmetic with answer-only replies: the default task, and a mixed-difficulty one.

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
from grpo.tasks.base import Task

_SPLIT_SEED = 1234


def _split(pairs: list[tuple[int, int]], heldout_size: int) -> tuple[list, list]:
    rng = random.Random(_SPLIT_SEED)
    pairs = pairs[:]
    rng.shuffle(pairs)
    return pairs[heldout_size:], pairs[:heldout_size]


_VALUE = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _row(a: int, op: str, b: int) -> dict:
    return {"prompt": f"What is {a} {op} {b}? Reply with only the number.", "answer": str(_VALUE[op](a, b))}


def _rows(pairs: list[tuple[int, int]], op: str) -> list[dict]:
    return [_row(a, op, b) for a, b in pairs]


def two_digit_addition(heldout_size: int = 256) -> Task:
    """a + b with a, b in 10..99 (8,100 pairs)."""
    train, heldout = _split([(a, b) for a in range(10, 100) for b in range(10, 100)], heldout_size)
    # 12 tokens hold "23 + 45 = 68" and its end (a cut completion scores 0); steps stay fast
    return Task("add", _rows(train, "+"), _rows(heldout, "+"), final_number, defaults={"max_new_tokens": 12})


_DIGITS = {1: range(0, 10), 2: range(10, 100), 3: range(100, 1000)}
# problems per (digits of a, digits of b, op) cell, by the digits of a and b together: every one-digit
# problem, fewer of each harder cell, so that the embedded model starts near 20% (see mixed_arithmetic)
_PER_CELL = {2: 100, 3: 60, 4: 25, 5: 20, 6: 20}


def _cell(da: int, op: str, db: int, rng: random.Random) -> list[tuple[int, str, int]]:
    """Distinct problems of one cell; a subtraction's result is never negative (a >= b)."""
    pairs = [(a, b) for a in _DIGITS[da] for b in _DIGITS[db] if op != "-" or a >= b]
    return [(a, op, b) for a, b in rng.sample(pairs, min(_PER_CELL[da + db], len(pairs)))]


def mixed_arithmetic(heldout_size: int = 256) -> Task:
    """a op b with one- to three-digit operands and op in + - * (915 problems): a wide range of difficulty.

    All 255 one-digit problems, 60 of each cell with three digits in all
    (7 + 73, 74 * 4, ...), 25 of each with four, 20 of each with five or six
    (152 * 127). The embedded model gets about half of the one-digit
    problems, one in eight with three digits and almost none beyond (it
    restates "a op b = " and errs or runs out of tokens), about 18% of all;
    GRPO has to teach the answer-only format and the arithmetic. Subtraction
    cells have a >= b, so there are no negative results.
    """
    rng = random.Random(_SPLIT_SEED)
    cells = [(da, op, db) for op in ("+", "-", "*") for da in _DIGITS for db in _DIGITS if op != "-" or da >= db]
    problems = [p for da, op, db in cells for p in _cell(da, op, db, rng)]
    rng.shuffle(problems)
    rows = [_row(a, op, b) for a, op, b in problems]
    return Task("arith-mix", rows[heldout_size:], rows[:heldout_size], final_number,
                defaults={"max_new_tokens": 16})  # "152 * 127 = 19304" and its end
