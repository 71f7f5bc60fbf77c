"""Turn a reward name into a callable: a built-in, ``module:function`` or ``file.py:function``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from grpo.user_code import import_user_module

RewardFn = Callable[[str, Mapping], float]


class RewardError(ValueError):
    """A reward name that does not resolve to a callable."""


def _builtin(name: str) -> RewardFn | None:
    import grpo.rewards as builtins

    return getattr(builtins, name) if name in builtins.BUILTIN_REWARDS else None


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
