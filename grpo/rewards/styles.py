"""Rewards written for other trainers, called unchanged: one batch interface over three signatures.

- ``grpo``: ``fn(completion: str, example: Mapping) -> float``, one call per completion.
- ``trl``: ``fn(completions, **kwargs) -> list[float | None]``, one call per batch, as TRL's
  GRPOTrainer calls it: ``prompts``, ``completions``, ``completion_ids`` and every column of
  the rows as keyword lists; conversational data (a prompt that is a list of messages) gets
  completions as ``[{"role": "assistant", "content": text}]``. ``None`` means "no reward from
  this function for this sample": it adds nothing to the total and is left out of the
  function's logged mean, as in TRL. ``async def`` functions are awaited.
- ``verl``: ``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``,
  one call per completion, by keyword as verl's reward manager calls it (a function that takes
  only ``solution_str, ground_truth``, like verl's own ``gsm8k.compute_score``, works too); a dict's ``score`` is the reward
  and its other numeric entries are logged as ``reward/<name>/<key>``. ``ground_truth`` is the
  row's ``reward_model.ground_truth`` (verl's parquet layout) or else its ``answer``.

The style is read from the signature (:func:`detect_style`) or given (``--reward-style``).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from grpo.rewards.base import RewardError

Style = Literal["grpo", "trl", "verl"]
STYLES: tuple[str, ...] = ("grpo", "trl", "verl")
ACCEPTED_FORMS = (
    "grpo: fn(completion, example) -> float; "
    "trl: fn(completions, **kwargs) -> list[float | None]; "
    "verl: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict"
)
# Keys TRL takes from the row itself rather than passing on as columns.
_TRL_OWN_KEYS = ("prompt", "completion", "completion_ids")


@dataclass(frozen=True)
class CallResult:
    """One completion's reward from one function: its value (None: no reward), or the error that replaced it."""

    value: float | None
    error: str | None = None
    timed_out: bool = False
    extras: dict[str, float] = field(default_factory=dict)


def _params(fn: Callable) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return None


def detect_style(fn: Callable) -> Style:
    """The calling convention ``fn`` was written for, from its parameter names; RewardError if none fits."""
    if hasattr(fn, "score_batch"):  # a learned reward model (grpo.rewards.model)
        return "grpo"
    params = _params(fn)
    if params is None:
        return "grpo"
    names = {p.name for p in params}
    if {"solution_str", "ground_truth"} <= names:
        return "verl"
    if "completions" in names:
        return "trl"
    try:
        inspect.signature(fn).bind("completion", {})
    except TypeError:
        raise RewardError(f"reward {_name(fn)} fits no accepted signature ({ACCEPTED_FORMS})") from None
    return "grpo"


def check_style(fn: Callable, style: str) -> Style:
    """The given style, checked against the signature by binding sample arguments (``auto``: detected)."""
    if style == "auto":
        return detect_style(fn)
    if style not in STYLES:
        raise RewardError(f"reward style must be auto, {', '.join(STYLES)}, got {style!r}")
    params = _params(fn)
    if hasattr(fn, "score_batch") or params is None:
        return style  # type: ignore[return-value]
    if style == "trl":  # its other parameters name dataset columns, known only when called
        if "completions" not in {p.name for p in params}:
            raise RewardError(f"reward {_name(fn)} does not fit the trl style ({ACCEPTED_FORMS})")
        return "trl"
    probes = {  # the arguments each style's call passes
        "grpo": (("completion", {}), {}),
        "verl": ((), _verl_kwargs(fn, "completion", {"answer": "1"})),
    }
    args, kwargs = probes[style]
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        raise RewardError(f"reward {_name(fn)} does not fit the {style} style ({ACCEPTED_FORMS})") from None
    return style  # type: ignore[return-value]


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _number(value: object) -> float | None:
    """A reward value as a finite float, None kept; anything else raises ValueError."""
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise ValueError(f"reward returned a non-finite value: {number}")
    return number


def _await(value: object) -> object:
    return asyncio.run(value) if inspect.isawaitable(value) else value  # type: ignore[arg-type]


def _trl_kwargs(texts: Sequence[str], rows: Sequence[Mapping], ids: Sequence[Sequence[int]] | None) -> dict:
    """What TRL's GRPOTrainer passes a reward function for these completions."""
    conversational = bool(rows) and isinstance(rows[0].get("prompt"), list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
    columns = {key for row in rows for key in row if key not in _TRL_OWN_KEYS}
    kwargs = {key: [row.get(key) for row in rows] for key in sorted(columns)}
    return {**kwargs, "prompts": [row.get("prompt") for row in rows], "completions": completions,
            "completion_ids": [list(x) for x in ids] if ids is not None else [[] for _ in texts]}


def call_trl(fn: Callable, texts: Sequence[str], rows: Sequence[Mapping],
             ids: Sequence[Sequence[int]] | None = None) -> list[CallResult]:
    """One call of a TRL-style function on a batch; an exception or a wrong length fails every sample."""
    try:
        values = _await(fn(**_trl_kwargs(texts, rows, ids)))
        if not isinstance(values, (list, tuple)) or len(values) != len(texts):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"a trl-style reward must return a list of {len(texts)} values, got {got}")
        return [CallResult(_number(v)) for v in values]
    except BaseException:  # the user's code: report it, whatever it raised
        return [CallResult(0.0, traceback.format_exc())] * len(texts)


def verl_ground_truth(row: Mapping) -> object:
    """verl's ground truth: ``reward_model.ground_truth`` in its parquet layout, else the row's answer."""
    model = row.get("reward_model")
    if isinstance(model, Mapping) and "ground_truth" in model:
        return model["ground_truth"]
    return row.get("answer")


def _verl_kwargs(fn: Callable, text: str, row: Mapping) -> dict:
    """verl's keyword arguments, less data_source/extra_info where the function takes neither
    (verl's own per-dataset scorers, e.g. ``gsm8k.compute_score(solution_str, ground_truth)``)."""
    kwargs = {"data_source": row.get("data_source", ""), "solution_str": text,
              "ground_truth": verl_ground_truth(row), "extra_info": row.get("extra_info")}
    params = _params(fn) or []
    if any(p.kind is p.VAR_KEYWORD for p in params) or not params:
        return kwargs
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


def call_verl(fn: Callable, text: str, row: Mapping) -> CallResult:
    """One ``compute_score`` call, by keyword as verl's reward manager makes it; a dict result
    gives ``score`` and logs its other numbers."""
    try:
        out = _await(fn(**_verl_kwargs(fn, text, row)))
        if isinstance(out, Mapping):
            if "score" not in out:
                raise ValueError(f"a verl-style reward returning a dict must hold 'score', got keys {sorted(out)}")
            extras = {str(k): float(v) for k, v in out.items()
                      if k != "score" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            return CallResult(_number(out["score"]), extras=extras)
        return CallResult(_number(out))
    except BaseException:
        return CallResult(0.0, traceback.format_exc())


def call_grpo(fn: Callable, text: str, row: Mapping) -> CallResult:
    """One ``(completion, example)`` call; None is not a grpo-style value, so it is an error here."""
    try:
        value = _number(_await(fn(text, row)))
        if value is None:
            raise ValueError("reward returned None (only trl-style rewards may skip a sample)")
        return CallResult(value)
    except BaseException:  # a reward's own sys.exit() must not end the worker silently either
        return CallResult(0.0, traceback.format_exc())


def call_batch(fn: Callable, style: str, texts: Sequence[str], rows: Sequence[Mapping],
               ids: Sequence[Sequence[int]] | None = None) -> list[CallResult]:
    """Every completion's result from one function, whatever its style."""
    if style == "trl":
        return call_trl(fn, texts, rows, ids)
    one = call_verl if style == "verl" else call_grpo
    return [one(fn, t, r) for t, r in zip(texts, rows, strict=True)]


def weighted_reward(fns: Sequence[Callable], styles: Sequence[str],
                    weights: Sequence[float] | None = None) -> Callable[[str, Mapping], float]:
    """One ``(completion, example) -> float``: the weighted sum of several rewards, each called in its
    style on a batch of one (for evaluation, which asks one completion at a time). A failed call or
    None counts 0, as in training with on_error="zero"."""
    weights = list(weights) if weights else [1.0] * len(fns)

    def total(text: str, row: Mapping) -> float:
        results = [call_batch(fn, style, [text], [row])[0] for fn, style in zip(fns, styles, strict=True)]
        return sum(w * (r.value or 0.0) for w, r in zip(weights, results, strict=True) if r.error is None)

    return total
