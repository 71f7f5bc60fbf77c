"""``code-retry``: write a function, see the sandboxed tests' result, fix it; a multi-turn example to copy.

The environment below is the whole of it. Each attempt (a policy turn) is run
against the row's asserts in the code sandbox (grpo/rewards/sandbox.py); when
some fail, the result and the tests come back as the next user message and
the model tries again, up to max_turns attempts. The episode's reward is the
last attempt's share of tests passed: each turn's reward is the change in
that share, so their sum is the last attempt's (with turn_discount 1). A
turn cut by the token limit ends the episode and does not count.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from grpo.rewards.code import extract_code, run_tests
from grpo.tasks.base import Task
from grpo.tasks.coding import _SPLIT_SEED, _rows


class CodeRetryEnv:
    """reset(row) opens the conversation; step(messages) tests the latest attempt and answers with the
    failures, or ends the episode when every test passes."""

    needs_sandbox = True  # the trainer checks the sandbox before the first episode

    def reset(self, example: Mapping) -> list[dict]:
        self.tests, self.score = example["tests"], 0.0
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, messages: list[dict]) -> tuple[list[dict] | None, float, bool]:
        passed, total = run_tests(extract_code(messages[-1]["content"]), self.tests)
        score = passed / total if total else 0.0
        reward, self.score = score - self.score, score  # the rewards sum to the last attempt's score
        if passed == total:
            return None, reward, True
        feedback = (f"{passed} of {total} tests passed. The tests:\n{self.tests}\n"
                    "Fix the code and reply with the whole function in a ```python block.")
        return [{"role": "user", "content": feedback}], reward, False


def no_reward(completion: str, example: Mapping) -> float:
    """0: the environment gives this task's reward."""
    return 0.0


def code_retry(heldout_size: int = 64) -> Task:
    """The `code` problems as episodes: sandboxed test results come back, up to 3 attempts (200 problems)."""
    rows = _rows()
    random.Random(_SPLIT_SEED).shuffle(rows)
    n = min(heldout_size, len(rows) // 2)
    return Task("code-retry", rows[n:], rows[:n], no_reward, defaults={"max_new_tokens": 96, "max_turns": 3},
                env=CodeRetryEnv)
