"""Turn a reward name into a callable: a built-in, ``module:function`` or ``file.py:function``."""

from __future__ import annotations

from pathlib import Path

from grpo.rewards.base import RewardError, RewardFn
from grpo.rewards.basic import (
    answer_only,
    exact_match,
    final_number,
    multiple_choice,
    no_reward,
    overlong_penalty,
    r1_zero_format,
    regex_match,
    think_format,
)
from grpo.rewards.code import code_tests, code_tests_all
from grpo.rewards.math import math_answer
from grpo.system.user_code import import_user_module

# the rewards named without a module (--rewards math_answer), and the functions they are
_BUILTINS: dict[str, RewardFn] = {
    "answer_only": answer_only, "code_tests": code_tests, "code_tests_all": code_tests_all, "exact_match": exact_match,
    "final_number": final_number, "math_answer": math_answer, "multiple_choice": multiple_choice, "none": no_reward,
    "overlong_penalty": overlong_penalty, "r1_zero_format": r1_zero_format, "regex_match": regex_match,
    "think_format": think_format,
}
BUILTIN_REWARDS = tuple(_BUILTINS)


def _builtin(name: str) -> RewardFn | None:
    return _BUILTINS.get(name)


def resolve_reward(spec: str | RewardFn) -> RewardFn:
    """A callable from a built-in name, ``package.module:function``, ``path/file.py:function``,
    or a reward-model folder (``AutoModelForSequenceClassification``)."""
    if callable(spec):
        return spec
    if Path(spec).is_dir():
        if not (Path(spec) / "config.json").is_file():
            raise RewardError(f"reward model folder {spec} has no config.json")
        from grpo.rewards.model import RewardModel

        return RewardModel(spec)
    if ":" not in spec:
        fn = _builtin(spec)
        if fn is None:
            raise RewardError(
                f"unknown reward {spec!r}: use a built-in name, module:function or file.py:function"
            )
        return fn
    where, _, attr = spec.rpartition(":")
    module = import_user_module(where, "reward", RewardError)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: {where} has no function {attr!r}")
    return fn
