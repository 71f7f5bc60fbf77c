"""``math_answer``: is the completion's one final answer equal to the gold answer?

Only a complete answer counts. A completion that ended by hitting the token
limit (the trainer and ``grpo eval`` mark its row ``truncated``) has no final
answer: "To add 31 and 2" cut inside "29" is not the answer 2, so it scores 0.

Extraction finds where the completion commits to an answer, in this order:
``\\boxed{...}``, ``#### x``, "the answer is x", ``<answer>...</answer>``, a
reply that is only the answer, a reply that ends "= x", "equals x", "is x" or
"gives x", and otherwise the last number of the text. That last, unmarked
number is no answer when it is one of the prompt's own numbers (compared as
values: "038" and "38.0" are 38): "Step 1: 76 - 38" restates the question,
it does not answer 38. Digits are ASCII only. Equivalence is
decided by math-verify (Hugging Face's checker: LaTeX, fractions, decimals,
percentages).

The checker is deliberately strict about hedging, because under GRPO any
answer that scores 1 without committing becomes a strategy: several
different boxed values, "5 or 6", a list of numbers, an echo of the
question, or an output longer than ``MAX_CHARS`` all score 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from grpo.rewards.answers import (
    MAX_ANSWER_CHARS,
    boxed_contents,
    final_answers,
    is_hedged,
    marked_answers,
    number_value,
    numbers_in,
    unthousand,
)
from grpo.rewards.basic import was_truncated

MAX_CHARS = MAX_ANSWER_CHARS

# the extraction lives in grpo.rewards.answers (final_number uses it too); its names stay importable here
__all__ = ["MAX_CHARS", "boxed_contents", "final_answers", "marked_answers", "math_answer", "number_value",
           "numbers_in", "same_answer"]


def _clean(answer: str) -> str:
    """Strip what math-verify should not see: $, trailing punctuation, thousands separators, units."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"^\\text\{(.*)\}$", r"\1", text)
    text = text.rstrip(".").strip()
    text = unthousand(text)
    text = re.sub(r"^\\?\$\s*", "", text)  # a leading currency sign
    if "\\" not in text:
        # "18 dollars", "18 eggs per day": keep the leading number when words follow it
        m = re.match(r"^(-?\d+(?:\.\d+)?(?:/\d+)?\s*%?)\s*[A-Za-z][A-Za-z\s]*$", text)
        if m:
            text = m.group(1)
    return text


def _parse(text: str) -> list:
    from math_verify import parse

    return parse(f"${text}$") or parse(text)


def same_answer(answer: str, gold: str) -> bool:
    """math-verify equivalence of one extracted answer and the gold answer."""
    from math_verify import verify

    got, want = _parse(_clean(answer)), _parse(_clean(gold))
    return bool(got and want and verify(want, got))


def math_answer(completion: str, example: Mapping) -> float:
    """1.0 when the completion's single final answer equals ``example['answer']`` (math-verify), else 0.0.

    A completion cut off by the token limit (``example['truncated']``) scores 0.
    """
    if len(completion) > MAX_CHARS or was_truncated(example):
        return 0.0
    prompt = str(example.get("prompt", "")).strip()
    if prompt:
        completion = completion.replace(prompt, " ")  # an echoed question is not an answer
    answers = final_answers(completion, prompt)
    if not answers or any(is_hedged(a) for a in answers):
        return 0.0
    if example.get("answer") is None:  # data without answers, trained on other rewards
        return 0.0
    gold = str(example["answer"])
    # Several final answers score only when they all agree with the gold one.
    return float(all(same_answer(a, gold) for a in answers))
