"""Reward functions: ``(completion: str, example: Mapping) -> float``.

``example`` is the dataset row the prompt came from (its ``answer`` and any
other fields). Users bring their own as ``module:function`` or
``path/to/file.py:function``; see :func:`resolve_reward`.
"""

from grpo.rewards.basic import answer_only, exact_match, final_number
from grpo.rewards.resolve import RewardError, resolve_reward

__all__ = ["RewardError", "answer_only", "exact_match", "final_number", "resolve_reward"]
