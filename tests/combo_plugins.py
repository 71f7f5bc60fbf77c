"""The user code the combination suite trains with (tests/test_combinations.py): a reward that raises on
some rows, a tool and an environment, each given to ``grpo train`` as path/to/this/file.py:name."""

from __future__ import annotations


def first_char(completion, example):
    """Graded and varied on a random model: most groups are mixed."""
    return (ord(completion[0]) % 5) / 4 if completion else 0.0


def odd_first_char_raises(completion, example):
    """first_char, raising on a completion whose first character's code is odd: some rows of most steps."""
    if completion and ord(completion[0]) % 2:
        raise ValueError("odd first character")
    return first_char(completion, example)


def echo(text: str) -> str:
    """Say the text back.

    Args:
        text: what to say back
    """
    return text


class Count:
    """Two turns: the policy writes, the environment answers with the length it wrote, the policy ends."""

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, messages):
        turns = sum(m["role"] == "assistant" for m in messages)
        return [{"role": "user", "content": str(len(messages[-1]["content"]))}], 0.0, turns >= 2
