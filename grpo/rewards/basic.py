"""Built-in checkers that need no extra library.

The answer checkers here (``exact_match``, ``answer_only``, ``final_number``,
``multiple_choice``) score 0 for a completion cut off by the token limit
(``example['truncated']``, set by the trainer and by evaluation): a cut
answer is no answer. The format rewards judge the text as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

from grpo.rewards.answers import ENDS_EQUALS as ENDS_EQUALS  # importable here, as before
from grpo.rewards.answers import MAX_ANSWER_CHARS, final_answers

_INT = re.compile(r"[+-]?\d+")


def was_truncated(example: Mapping) -> bool:
    """Did the completion end by hitting the token limit? (The trainer and evaluation set ``truncated``.)"""
    return bool(example.get("truncated", False))


def no_reward(completion: str, example: Mapping) -> float:
    """--rewards none: 0 for every completion. A run with it learns from its teacher alone (pure on-policy
    distillation, grpo/learning/teacher/), which it needs."""
    return 0.0


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


def final_number(completion: str, example: Mapping) -> float:
    """1.0 when the completion's final answer equals the numeric ``example['answer']`` (as numbers).

    The answer is found as ``math_answer`` finds it: a marked answer first
    (``\\boxed{}``, ``#### x``, "the answer is x", a reply that is only the
    number, "= x" / "is x" at the end), else the last number, so "23 + 45 = 68"
    is right and "68, or maybe 69" is not. Thousands separators are ignored.
    Not an answer, so 0: a completion cut off by the token limit, an unmarked
    last number that is one of the prompt's own ("23 + 45" echoes an operand),
    several answers that disagree, and anything over 32,000 characters.
    """
    if was_truncated(example) or len(completion) > MAX_ANSWER_CHARS:
        return 0.0
    prompt = str(example.get("prompt", "")).strip()
    answers = final_answers(completion.replace(prompt, " ") if prompt else completion, prompt)
    gold = _leading_number(str(example["answer"]))
    values = [_leading_number(a) for a in answers]
    return float(bool(values) and gold is not None and all(v == gold for v in values))


_LEADING = re.compile(r"\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?(?:/[0-9]+)?)", re.ASCII)


def _leading_number(text: str) -> Fraction | None:
    """The number a short answer starts with ("$1,234.00 dollars" is 1234); None when it starts with none."""
    m = _LEADING.match(text)
    if m is None:
        return None
    try:
        return Fraction(m.group(1).replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


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


def r1_zero_format(completion: str, example: Mapping) -> float:
    """``think_format`` of a completion sampled after R1-Zero's cue, which ends in ``<think>``
    (grpo/sampling/prompts.py): the completion starts inside the reasoning, so the cue's tag is put back first."""
    return think_format("<think>" + completion, example)


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
