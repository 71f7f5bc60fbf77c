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
