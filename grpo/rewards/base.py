"""What a reward is: a function of a completion and its dataset row; and the error for one that cannot
be used.

RewardError lives here, below every other module of grpo.rewards, so that the sandbox, the calling
styles and the combination can raise it without importing the resolver (which imports the built-ins).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

RewardFn = Callable[[str, Mapping], float]


class RewardError(ValueError):
    """A reward name that does not resolve to a callable."""
