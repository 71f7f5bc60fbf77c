"""Turn a reward name into a callable: a built-in, ``module:function`` or ``file.py:function``."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path

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
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward file not found: {where}")
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(mod_spec)
        try:
            mod_spec.loader.exec_module(module)
        except Exception as err:  # the user's file: report, don't trace
            raise RewardError(f"cannot import reward file {where}: {err}") from err
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise RewardError(f"cannot import reward module {where!r}: {err}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: {where} has no function {attr!r}")
    return fn
