"""Built-in checkers that need no extra library."""

from __future__ import annotations

import re
from collections.abc import Mapping

_INT = re.compile(r"[+-]?\d+")


def exact_match(completion: str, example: Mapping) -> float:
    """1.0 when the completion, whitespace-trimmed, equals str(example['answer'])."""
    return float(completion.strip() == str(example["answer"]).strip())


def answer_only(completion: str, example: Mapping) -> float:
    """1.0 when the completion is the integer answer and nothing else.

    For prompts that say "Reply with only the number": surrounding whitespace
    and one trailing period are tolerated, anything else ("12 + 34 = 46",
    "46 or 47", a second line) scores 0. The strictness is the point: the
    task is to follow the instruction and be right.
    """
    text = completion.strip()
    if text.endswith("."):
        text = text[:-1].rstrip()
    if not _INT.fullmatch(text):
        return 0.0
    return float(int(text) == int(example["answer"]))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(completion: str, example: Mapping) -> float:
    """1.0 when the last number in the completion equals the numeric answer.

    Thousands separators are ignored ("1,234" is 1234). A completion with no
    number scores 0. Only the final number counts, so "23 + 45 = 68" is right
    and "68, or maybe 69" is wrong.
    """
    found = _NUMBER.findall(completion)
    if not found:
        return 0.0
    try:
        return float(float(found[-1].replace(",", "")) == float(str(example["answer"]).replace(",", "")))
    except ValueError:
        return 0.0
