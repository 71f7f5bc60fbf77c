"""A small built-in coding task: write one short Python function, checked by ``code_tests``.

Families of one-line functions with a parameter (add k, repeat a string,
count a letter, ...) give a few hundred distinct problems; train and
held-out are split once with a fixed seed, so they share no problem. Each row
carries a reference ``solution``, which ``grpo check-reward`` checks scores 1.
"""

from __future__ import annotations

import random

from grpo.rewards.code import code_tests
from grpo.tasks.base import Task

_SPLIT_SEED = 1234


def _add(k: int) -> tuple[str, str, str]:
    return (f"Write a Python function `add_k(x)` that returns x + {k}.",
            "\n".join(f"assert add_k({x}) == {x + k}" for x in (0, 3, -7, 100)),
            f"def add_k(x):\n    return x + {k}\n")


def _times(k: int) -> tuple[str, str, str]:
    return (f"Write a Python function `scale(xs)` that returns a new list with every element of xs multiplied by {k}.",
            "\n".join(f"assert scale({xs}) == {[x * k for x in xs]}" for xs in ([], [1], [2, -3, 5])),
            f"def scale(xs):\n    return [x * {k} for x in xs]\n")


def _count(k: int) -> tuple[str, str, str]:
    letter = "abcdefghijklmnopqrstuvwxyz"[k % 26]
    words = ("banana", "", f"{letter}x{letter}", "mississippi")
    return (f"Write a Python function `count_letter(s)` that returns how many times '{letter}' occurs in s.",
            "\n".join(f"assert count_letter({w!r}) == {w.count(letter)}" for w in words),
            f"def count_letter(s):\n    return s.count({letter!r})\n")


def _over(k: int) -> tuple[str, str, str]:
    lists = ([], [k, k + 1], [1, 2, k + 5, -k])
    return (f"Write a Python function `above(xs)` that returns the elements of xs greater than {k}, in order.",
            "\n".join(f"assert above({xs}) == {[x for x in xs if x > k]}" for xs in lists),
            f"def above(xs):\n    return [x for x in xs if x > {k}]\n")


def _rows() -> list[dict]:
    rows: dict[str, dict] = {}  # by prompt: count_letter repeats every 26
    for family in (_add, _times, _count, _over):
        for k in range(2, 60):
            text, tests, solution = family(k)
            prompt = f"{text} Reply with the code in a ```python block."
            rows.setdefault(prompt, {"prompt": prompt, "answer": "", "tests": tests, "solution": solution})
    return list(rows.values())


def coding(heldout_size: int = 64) -> Task:
    """200 one-function problems, scored by the fraction of asserts passed in the sandbox."""
    rows = _rows()
    random.Random(_SPLIT_SEED).shuffle(rows)
    n = min(heldout_size, len(rows) // 2)
    return Task("code", rows[n:], rows[:n], code_tests)
