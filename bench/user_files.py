"""Writes the data files issue 26's acceptance runs use, as a user would bring them to `grpo train --data`.

    python bench/user_files.py DIR

- DIR/subtract.jsonl: 3000 two-digit subtractions, "What is a - b? Reply with only the number.", a >= b.
- DIR/stories.jsonl: 3000 one-line word problems (two-digit addition) whose answer is one number but whose
  wording invites the model to explain ("Explain how many ..."): an untrained model rambles past the answer.

Rows are {"question", "answer"} (the loader's usual field names); the seed is fixed, so the files are the same
on every machine.
"""

from __future__ import annotations

import json
import random
import sys
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


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/user_files.py DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, make in (("subtract", subtractions), ("stories", stories)):
        rows = make(random.Random(name), 3000)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{out / name}.jsonl: {len(rows)} rows, e.g. {rows[0]['question']!r} -> {rows[0]['answer']}")


if __name__ == "__main__":
    main()
