"""Where a completion commits to an answer: the extraction ``final_number`` and ``math_answer`` share.

A marked answer first (``\\boxed{...}``, ``#### x``, "the answer is x", ``<answer>...</answer>``,
a reply that is only the answer, "= x" or "equals x" at the end), else the last number, which
is no answer when it is one of the prompt's own; and whether an answer hedges ("5 or 6"). The
rules, and why they are strict, are in :mod:`grpo.rewards.math`. Digits are ASCII only.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 32_000
"""Longer completions score 0 with the answer checkers: no real answer needs 100 kB, a spray of guesses might."""
ENDS_EQUALS = re.compile(r"(?:=|\bequals|\bis|\bgives|\bmakes|\banswer:)\s*\$?(-?\d+(?:\.\d+)?(?:/\d+)?)\s*\.?\s*$",
                         re.IGNORECASE | re.ASCII)
"""A reply ending "= x", "equals x", "is x" or "gives x": x is marked as the result."""

# re.ASCII: only 0-9 are digits, so "٧٦" (Arabic-Indic) is no number to match an operand or an answer
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])", re.ASCII)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?", re.ASCII)
_OR_HEDGE = re.compile(r"\d\s*\)?\s*(?:,\s*)?or\b", re.IGNORECASE | re.ASCII)
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HEDGE = re.compile(r"\d\s*(?:\\text\{\s*)?\b(?:or|and|to)\b", re.IGNORECASE)
_LIST_ONLY = re.compile(r"^[\s\d.,;:/\-+()\[\]$%]*$")
_ONLY_NUMBER = re.compile(r"\$?(-?\d+(?:\.\d+)?(?:/\d+)?)\.?", re.ASCII)


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (and ``\\fbox{...}``), braces balanced."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def unthousand(text: str) -> str:
    """``text`` without its thousands separators ("1,234" is 1234)."""
    return _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), text)


def number_value(text: str) -> Fraction | None:
    """The unsigned value of a plain number ("038", "38.0" and "-38" are all 38); None for anything else."""
    try:
        return abs(Fraction(unthousand(text.strip().strip("$").rstrip(".").strip())))
    except (ValueError, ZeroDivisionError):
        return None


def numbers_in(text: str) -> set[Fraction]:
    """The unsigned values of the numbers written in ``text`` ("1,234" is 1234; "2/3" gives 2/3, 2 and 3)."""
    found = _NUMBER.findall(unthousand(text))
    parts = [p for n in found for p in (n, *n.lstrip("-").split("/"))]
    return {v for v in map(number_value, parts) if v is not None}


def marked_answers(completion: str) -> list[str]:
    """The answers the completion explicitly marks as final, from the first marking it uses (may be empty)."""
    boxed = boxed_contents(completion)
    if boxed:
        return boxed
    for pattern in (_HASHES, _ANSWER_IS, _ANSWER_TAG):
        found = pattern.findall(completion)
        if found:
            return [re.split(r"\.\s", f, maxsplit=1)[0] for f in found]  # the sentence, not the line
    text = unthousand(completion.strip())
    m = _ONLY_NUMBER.fullmatch(text) or ENDS_EQUALS.search(text)
    return [m.group(1)] if m else []


def final_answers(completion: str, prompt: str = "") -> list[str]:
    """Every final answer the completion commits to, from the first format it uses (may be empty).

    An unmarked answer that is one of the prompt's own numbers is no answer: "Step 1: 76 - 38"
    restates the question, it does not answer 38. A final line offering "a or b" gives both.
    """
    marked = marked_answers(completion)
    last_line = unthousand(completion.strip().splitlines()[-1]) if completion.strip() else ""
    if _OR_HEDGE.search(last_line) and len(_NUMBER.findall(last_line)) > 1:
        return _NUMBER.findall(last_line)  # "67 or 68", "x = 69 or x = 68": several answers
    if marked:
        return marked
    unmarked = _unmarked_answers(completion)
    asked = numbers_in(prompt)
    if prompt and unmarked and all(number_value(a) in asked for a in unmarked):
        return []  # only the question's own number, nothing marked: an echo, not an answer
    return unmarked


def _unmarked_answers(completion: str) -> list[str]:
    """The last line's value after '=', a bare list of numbers (several answers), or the last number."""
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return []
    last_line = unthousand(lines[-1])
    if "=" in last_line:
        last_line = last_line.rsplit("=", 1)[1]
    numbers = _NUMBER.findall(last_line)
    if len(numbers) > 1 and _LIST_ONLY.match(last_line):
        return numbers  # a bare list of numbers: several answers
    all_numbers = _NUMBER.findall(unthousand(completion))
    return all_numbers[-1:]


def is_hedged(answer: str) -> bool:
    """'5 or 6', '3, 4, 5', '2 and 3': more than one value offered as the answer."""
    text = unthousand(answer)
    if _HEDGE.search(text) and len(_NUMBER.findall(text)) > 1:
        return True
    if "\\" not in text and "{" not in text:
        return len(_NUMBER.findall(re.sub(r"\d+/\d+", "0", text))) > 1
    return False
