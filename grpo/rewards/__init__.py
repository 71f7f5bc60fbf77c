"""Reward functions: ``(completion: str, example: Mapping) -> float``.

``example`` is the dataset row the prompt came from (its ``answer`` and any
other fields). Users bring their own as ``module:function`` or
``path/to/file.py:function``, or a reward-model folder; see :func:`resolve_reward`.
Several rewards are combined, with weights, by :func:`combine_rewards`.

The trainer adds to each row ``truncated`` (the completion hit the token
limit), ``completion_tokens`` and ``max_completion_tokens``. The rules of the
answer checkers, which GRPO will otherwise learn to exploit:

- only complete answers count: a completion cut off by the token limit has
  no final answer and scores 0 (``math_answer``, ``final_number``,
  ``answer_only``, ``exact_match``, ``multiple_choice``);
- an explicitly marked answer (``\\boxed{}``, ``#### x``, "the answer is x",
  ``<answer>``, a reply that is only the answer, "= x" or "equals x" at the
  end) is preferred to numbers in passing;
- a completion whose numbers are all the prompt's own, with nothing marked
  as the answer, is no answer ("76 - 38 equals" does not answer 38);
- several different answers, hedges ("5 or 6") and outputs over 32,000
  characters score 0.

``grpo check-reward`` probes these rules (and more) on your data.
"""

from grpo.rewards.basic import (
    answer_only,
    exact_match,
    final_number,
    multiple_choice,
    overlong_penalty,
    r1_zero_format,
    regex_match,
    soft_overlong_penalty,
    think_format,
)
from grpo.rewards.code import code_tests, code_tests_all
from grpo.rewards.combine import RewardCallError, RewardScorer, combine_rewards
from grpo.rewards.math import math_answer
from grpo.rewards.resolve import BUILTIN_REWARDS, RewardError, resolve_reward

__all__ = [
    "BUILTIN_REWARDS",
    "RewardCallError", "RewardError", "RewardScorer", "answer_only", "code_tests", "code_tests_all",
    "combine_rewards", "exact_match", "final_number", "math_answer", "multiple_choice", "overlong_penalty", "r1_zero_format",
    "regex_match", "resolve_reward", "soft_overlong_penalty", "think_format",
]
