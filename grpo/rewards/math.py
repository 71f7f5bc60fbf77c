"""``math_answer``: is the completion's one final answer equal to the gold answer?

Extraction finds where the completion commits to an answer, in this order:
``\\boxed{...}``, ``#### x``, "the answer is x", ``<answer>...</answer>``, and
otherwise the last number of the text. Equivalence is decided by
math-verify (Hugging Face's checker: LaTeX, fractions, decimals, percentages).

The checker is deliberately strict about hedging, because under GRPO any
answer that scores 1 without committing becomes a strategy: several
different boxed values, "5 or 6", a list of numbers, an echo of the
question, or an output longer than ``MAX_CHARS`` all score 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_CHARS = 32_000
"""Completions longer than this score 0: no real answer needs 100 kB, a spray of guesses might."""

_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HEDGE = re.compile(r"\d\s*(?:\\text\{\s*)?\b(?:or|and|to)\b", re.IGNORECASE)
_LIST_ONLY = re.compile(r"^[\s\d.,;:/\-+()\[\]$%]*$")


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


def final_answers(completion: str) -> list[str]:
    """Every final answer the completion commits to, from the first format it uses (may be empty)."""
    boxed = boxed_contents(completion)
    if boxed:
        return boxed
    for pattern in (_HASHES, _ANSWER_IS, _ANSWER_TAG):
        found = pattern.findall(completion)
        if found:
            return [re.split(r"\.\s", f, maxsplit=1)[0] for f in found]  # the sentence, not the line
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    if not lines:
        return []
    last_line = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), lines[-1])
    if "=" in last_line:
        last_line = last_line.rsplit("=", 1)[1]
    numbers = _NUMBER.findall(last_line)
    if len(numbers) > 1 and _LIST_ONLY.match(last_line):
        return numbers  # a bare list of numbers: several answers
    all_numbers = _NUMBER.findall(_THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), completion))
    return all_numbers[-1:]


def _clean(answer: str) -> str:
    """Strip what math-verify should not see: $, trailing punctuation, thousands separators, units."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"^\\text\{(.*)\}$", r"\1", text)
    text = text.rstrip(".").strip()
    text = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), text)
    text = re.sub(r"^\\?\$\s*", "", text)  # a leading currency sign
    if "\\" not in text:
        # "18 dollars", "18 eggs per day": keep the leading number when words follow it
        m = re.match(r"^(-?\d+(?:\.\d+)?(?:/\d+)?\s*%?)\s*[A-Za-z][A-Za-z\s]*$", text)
        if m:
            text = m.group(1)
    return text


def _is_hedged(answer: str) -> bool:
    """'5 or 6', '3, 4, 5', '2 and 3': more than one value offered as the answer."""
    text = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), answer)
    if _HEDGE.search(text) and len(_NUMBER.findall(text)) > 1:
        return True
    if "\\" not in text and "{" not in text:
        return len(_NUMBER.findall(re.sub(r"\d+/\d+", "0", text))) > 1
    return False


def _parse(text: str) -> list:
    from math_verify import parse

    return parse(f"${text}$") or parse(text)


def same_answer(answer: str, gold: str) -> bool:
    """math-verify equivalence of one extracted answer and the gold answer."""
    from math_verify import verify

    got, want = _parse(_clean(answer)), _parse(_clean(gold))
    return bool(got and want and verify(want, got))


def math_answer(completion: str, example: Mapping) -> float:
    """1.0 when the completion's single final answer equals ``example['answer']`` (math-verify), else 0.0."""
    if len(completion) > MAX_CHARS:
        return 0.0
    prompt = str(example.get("prompt", "")).strip()
    if prompt:
        completion = completion.replace(prompt, " ")  # an echoed question is not an answer
    answers = final_answers(completion)
    if not answers or any(_is_hedged(a) for a in answers):
        return 0.0
    if example.get("answer") is None:  # data without answers, trained on other rewards
        return 0.0
    gold = str(example["answer"])
    # Several final answers score only when they all agree with the gold one.
    return float(all(same_answer(a, gold) for a in answers))
