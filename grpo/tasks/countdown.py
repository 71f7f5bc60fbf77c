"""Countdown: reach a target from given numbers with + - * / (as in TinyZero).

"Using the numbers [19, 36, 55, 7], write an expression that equals 65 ..."
The reply's expression (inside ``<answer>...</answer>``) is checked by
walking its syntax tree: only numbers, the four operators and parentheses
are allowed, each given number must be used exactly once, and it is
evaluated with exact fractions. Model text is never passed to ``eval``.
Puzzles are generated from a fixed seed and split once into disjoint sets.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Mapping
from fractions import Fraction

from grpo.tasks.base import Task

_SPLIT_SEED = 1234
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, numbers used) of an arithmetic expression, or None if it is not one."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("not allowed")

    try:
        return walk(tree.body), used
    except (ValueError, ZeroDivisionError):
        return None


def countdown_reward(completion: str, example: Mapping) -> float:
    """1.0 when the last <answer> expression uses every number exactly once and equals the target."""
    answers = _ANSWER.findall(completion)
    if not answers:
        return 0.0
    expression = answers[-1].split("=")[0]
    result = evaluate(expression)
    if result is None:
        return 0.0
    value, used = result
    return float(sorted(used) == sorted(example["numbers"]) and value == int(example["target"]))


def _puzzle(rng: random.Random, count: int) -> tuple[list[int], int] | None:
    """Numbers and a reachable positive integer target (built from a random expression over them)."""
    numbers = [rng.randint(1, 60) for _ in range(count)]
    values = [Fraction(n) for n in numbers]
    rng.shuffle(values)
    acc = values[0]
    for v in values[1:]:
        op = rng.choice(list(_OPS.values()))
        try:
            acc = op(acc, v) if rng.random() < 0.5 else op(v, acc)
        except ZeroDivisionError:
            return None
    if acc.denominator != 1 or not 1 <= acc <= 999:
        return None
    return numbers, int(acc)


def _row(numbers: list[int], target: int) -> dict:
    prompt = (f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. "
              "Use each number exactly once, with + - * / and parentheses. "
              "Show your work in <think> </think> tags and put only the expression in <answer> </answer> tags.")
    return {"prompt": prompt, "answer": str(target), "numbers": numbers, "target": target}


def countdown(heldout_size: int = 256, size: int = 10_000) -> Task:
    """3 or 4 numbers in 1..60, target in 1..999; train and held-out share no (numbers, target)."""
    rng = random.Random(_SPLIT_SEED)
    seen: dict[tuple, dict] = {}
    while len(seen) < size:
        puzzle = _puzzle(rng, rng.choice((3, 4)))
        if puzzle is not None:
            key = (tuple(sorted(puzzle[0])), puzzle[1])
            seen.setdefault(key, _row(*puzzle))
    rows = list(seen.values())
    return Task("countdown", rows[heldout_size:], rows[:heldout_size], countdown_reward)
