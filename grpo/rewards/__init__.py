"""Reward functions: ``(completion: str, example: Mapping) -> float``.

``example`` is the dataset row the prompt came from (its ``answer`` and any
other fields). Users bring their own as ``module:function`` or
``path/to/file.py:function``, or a reward-model folder; see :func:`resolve_reward`.
Several rewards are combined, with weights, by :func:`combine_rewards`.
"""

from grpo.rewards.basic import (
    answer_only,
    exact_match,
    final_number,
    multiple_choice,
    overlong_penalty,
    regex_match,
    soft_overlong_penalty,
    think_format,
)
from grpo.rewards.code import code_tests, code_tests_all
from grpo.rewards.combine import RewardCallError, RewardScorer, combine_rewards
from grpo.rewards.math import math_answer
from grpo.rewards.resolve import RewardError, resolve_reward

BUILTIN_REWARDS = (
    "answer_only", "code_tests", "code_tests_all", "exact_match", "final_number", "math_answer", "multiple_choice",
    "overlong_penalty", "regex_match", "think_format",
)

__all__ = [
    "BUILTIN_REWARDS",
    "RewardCallError", "RewardError", "RewardScorer", "answer_only", "code_tests", "code_tests_all",
    "combine_rewards", "exact_match", "final_number", "math_answer", "multiple_choice", "overlong_penalty", "regex_match",
    "resolve_reward", "soft_overlong_penalty", "think_format",
]
