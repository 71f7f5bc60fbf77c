"""Writes the data files issues 26's and 35's acceptance runs use, as a user would bring them to `grpo train --data`.

    python bench/user_files.py DIR

- DIR/subtract.jsonl: 3000 two-digit subtractions, "What is a - b? Reply with only the number.", a >= b.
- DIR/stories.jsonl: 3000 one-line word problems (two-digit addition) whose answer is one number but whose
  wording invites the model to explain ("Explain how many ..."): an untrained model rambles past the answer.
- DIR/larger.jsonl: every ordered pair of distinct two-digit numbers once, shuffled (8010 rows), "Which is
  larger, a or b? Reply with only the number." (the embedded model starts at about 21% greedy).
- DIR/times.jsonl: a x b for a = 2..12 and b = 2..20 (209 rows, shuffled), "What is a times b? Reply with
  only the number.": a file the untrained model already half solves (57.7% greedy on the 104 held-out rows
  grpo train --data splits off).

Rows are {"question", "answer"} (the loader's usual field names); the seed is fixed, so the files are the same
on every machine.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
THINGS = ["apples", "books", "coins", "stamps", "marbles", "pencils", "shells", "cards"]


def subtractions(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        a, b = max(a, b), min(a, b)
        rows.append({"question": f"What is {a} - {b}? Reply with only the number.", "answer": str(a - b)})
    return rows


def stories(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(10, 49), rng.randint(10, 49)
        question = f"{name} has {a} {thing} and gets {b} more. Explain how many {thing} {name} has now."
        rows.append({"question": question, "answer": str(a + b)})
    return rows


def shuffled_pairs(rng: random.Random, pairs: list[tuple[int, int]], n: int, question: str,
                   answer: Callable[[int, int], int]) -> list[dict]:
    """The first n of ``pairs`` shuffled, each as a row: ``question`` formatted with a and b, and its answer."""
    rng.shuffle(pairs)
    return [{"question": question.format(a=a, b=b), "answer": str(answer(a, b))} for a, b in pairs[:n]]


def larger(rng: random.Random, n: int) -> list[dict]:
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if a != b]
    return shuffled_pairs(rng, pairs, n, "Which is larger, {a} or {b}? Reply with only the number.", max)


def times(rng: random.Random, n: int) -> list[dict]:
    pairs = [(a, b) for a in range(2, 13) for b in range(2, 21)]
    return shuffled_pairs(rng, pairs, n, "What is {a} times {b}? Reply with only the number.", lambda a, b: a * b)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/user_files.py DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, make, n in (("subtract", subtractions, 3000), ("stories", stories, 3000), ("larger", larger, 8010),
                         ("times", times, 209)):
        rows = make(random.Random(name), n)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{out / name}.jsonl: {len(rows)} rows, e.g. {rows[0]['question']!r} -> {rows[0]['answer']}")


if __name__ == "__main__":
    main()
