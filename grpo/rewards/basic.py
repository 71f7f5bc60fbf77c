"""Built-in checkers that need no extra library.

The answer checkers here (``exact_match``, ``answer_only``, ``final_number``,
``multiple_choice``) score 0 for a completion cut off by the token limit
(``example['truncated']``, set by the trainer and by evaluation): a cut
answer is no answer. The format rewards judge the text as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_INT = re.compile(r"[+-]?\d+")


def was_truncated(example: Mapping) -> bool:
    """Did the completion end by hitting the token limit? (The trainer and evaluation set ``truncated``.)"""
    return bool(example.get("truncated", False))


def exact_match(completion: str, example: Mapping) -> float:
    """1.0 when the completion, whitespace-trimmed, equals str(example['answer'])."""
    if was_truncated(example):
        return 0.0
    return float(completion.strip() == str(example["answer"]).strip())


def answer_only(completion: str, example: Mapping) -> float:
    """1.0 when the completion is the integer answer and nothing else.

    For prompts that say "Reply with only the number": surrounding whitespace
    and one trailing period are tolerated, anything else ("12 + 34 = 46",
    "46 or 47", a second line) scores 0. The strictness is the point: the
    task is to follow the instruction and be right.
    """
    text = completion.strip()
    if was_truncated(example):
        return 0.0
    if text.endswith("."):
        text = text[:-1].rstrip()
    if not _INT.fullmatch(text):
        return 0.0
    return float(int(text) == int(example["answer"]))


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MAX_ANSWER_CHARS = 32_000
"""Longer completions score 0 with the answer checkers: no real answer needs 100 kB, a spray of guesses might."""
ENDS_EQUALS = re.compile(r"(?:=|\bequals|\banswer is|\banswer:)\s*\$?(-?\d+(?:\.\d+)?(?:/\d+)?)\s*\.?\s*$", re.IGNORECASE)
"""A reply ending "= x", "equals x" or "the answer is x": x is marked as the result."""


def final_number(completion: str, example: Mapping) -> float:
    """1.0 when the last number in the completion equals the numeric answer.

    Thousands separators are ignored ("1,234" is 1234). A completion with no
    number scores 0. Only the final number counts, so "23 + 45 = 68" is right
    and "68, or maybe 69" is wrong. Not an answer, so 0: a completion cut off
    by the token limit, and one whose numbers are all the prompt's own unless
    it is only a number ("23 + 45 =" echoes the operands).
    """
    found = _NUMBER.findall(completion)
    if not found or was_truncated(example) or len(completion) > MAX_ANSWER_CHARS:
        return 0.0
    own = {n.replace(",", "").lstrip("-") for n in found}  # the echo rule, as in math_answer
    asked = {n.replace(",", "").lstrip("-") for n in _NUMBER.findall(str(example.get("prompt", "")))}
    marked = _NUMBER.fullmatch(completion.strip().rstrip(".")) or ENDS_EQUALS.search(completion.replace(",", ""))
    if own <= asked and not marked:
        return 0.0
    try:
        return float(float(found[-1].replace(",", "")) == float(str(example["answer"]).replace(",", "")))
    except ValueError:
        return 0.0
def regex_match(completion: str, example: Mapping) -> float:
    """1.0 when the whole stripped completion matches the regular expression ``example['pattern']``."""
    return float(re.fullmatch(str(example["pattern"]), completion.strip(), flags=re.DOTALL) is not None)


_CHOICE_PATTERNS = (
    re.compile(r"\\boxed\{\s*\(?([A-J])\)?\s*\}"),
    re.compile(r"<answer>\s*\(?([A-J])\)?\s*</answer>"),
    re.compile(r"answer\s*(?:is|:)\s*:?\s*\(?([A-J])\b\)?", re.IGNORECASE),
    re.compile(r"^\s*\(?([A-J])[).:]?\s*$", re.MULTILINE),
)


def multiple_choice(completion: str, example: Mapping) -> float:
    """1.0 when the one letter (A-J) the completion picks is ``example['answer']``.

    The letter is taken from ``\\boxed{B}``, ``<answer>B</answer>``, "the answer is (B)"
    or a line holding only the letter, in that order. Naming two different letters scores 0.
    """
    if was_truncated(example):
        return 0.0
    for pattern in _CHOICE_PATTERNS:
        letters = set(pattern.findall(completion))
        if letters:
            return float(letters == {str(example["answer"]).strip().strip("()").upper()})
    return 0.0


_THINK_ANSWER = re.compile(r"\s*<think>(.+?)</think>\s*<answer>(.+?)</answer>\s*", re.DOTALL)


def think_format(completion: str, example: Mapping) -> float:
    """1.0 for DeepSeek-R1's layout: ``<think>...</think>`` then ``<answer>...</answer>``, nothing else.

    Each tag appears exactly once and both parts are non-empty, so a reply
    that hides a second answer inside the reasoning or after the tag fails.
    """
    m = _THINK_ANSWER.fullmatch(completion)
    if m is None or not m.group(1).strip() or not m.group(2).strip():
        return 0.0
    tags = ("<think>", "</think>", "<answer>", "</answer>")
    return float(all(completion.count(tag) == 1 for tag in tags))


def soft_overlong_penalty(length: int, max_length: int, cache_length: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), in [-1, 0].

    0 while |y| <= L_max - L_cache; then falls linearly,
    ((L_max - L_cache) - |y|) / L_cache, to -1 at L_max; -1 beyond.
    """
    free = max_length - cache_length
    if length <= free:
        return 0.0
    if length <= max_length:
        return (free - length) / cache_length
    return -1.0


def overlong_penalty(completion: str, example: Mapping) -> float:
    """DAPO's soft overlong punishment of a completion, in tokens.

    The trainer's scorer adds ``completion_tokens`` and ``max_completion_tokens``
    (max_new_tokens) to each row; the penalty zone is the last 20% of the
    budget, as DAPO's 4k of 20k. Outside the trainer, pass those two keys.
    """
    max_length = int(example["max_completion_tokens"])
    cache = max(1, max_length // 5)
    return soft_overlong_penalty(int(example["completion_tokens"]), max_length, cache)
