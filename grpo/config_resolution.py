"""The one rule that fills what the user did not give, and where each value came from: the objective's
recommended settings, the task's tuned ones (a --data file's), then the general defaults; a given option
the chosen objective or estimator does not read is refused. A run resolves its configuration once, before
anything loads."""

from __future__ import annotations

import dataclasses
import typing

from grpo.config import (
    DATA_MAX_NEW_TOKENS,
    READERS,
    ConfigError,
    TrainConfig,
    automatic,
    option_fields,
    with_given,
)
from grpo.math.recommended import RECOMMENDED

if typing.TYPE_CHECKING:
    from grpo.tasks import Task

DEFAULT_STEPS = 20  # steps for a task that sets none
SCALED = ("grpo", "passk")  # the estimators that read scale
DEFAULT_LR = 3e-5  # tuned on the embedded model's add task; a task's own setting comes first (a --data file's: 1e-5)
DEFAULT_SAMPLER = "frontier"  # a task's own setting comes first (a --data file's: uniform, see grpo/tasks/data.py)
BUDGET_STEPS = 20  # the steps a run under a time budget plans its evaluations and alarm window for


def resolve_config(config: TrainConfig, task: Task, origin: typing.Mapping[str, str] | None = None
                   ) -> tuple[TrainConfig, dict[str, str]]:
    """The one rule that fills what the user did not give, and where each value came from.

    ``config.given`` is what the user gave (``origin`` says where: cli or file; python where it says
    nothing); it stands. What was not given comes, in order, from the objective's recommended settings
    (RECOMMENDED), the task's tuned settings (a --data file's: ``data``), then the general defaults. A
    task's time budget (``minutes``) belongs with its step count: a run that names its steps runs them all.
    Refuses, naming it, a given option that the chosen objective or estimator does not read. An option
    ``origin`` names that was not given (TRL's default, which a TRL config file fills: source trl) keeps its
    value and source, and is not refused."""
    refuse_unread(config)
    origin = origin or {}
    # a value a config file filled without giving it (TRL's default for a key the file leaves unset) stands
    kept = {name for name in origin if name not in config.given}
    sources = {f.name: origin.get(f.name, "python" if f.name in config.given else "default") for f in option_fields()}
    if "batch_size" in config.given or "batch_size" in kept:  # the other way to give prompts_per_step
        sources["prompts_per_step"] = sources["batch_size"]
    values: dict[str, object] = {}

    def fill(name: str, value: object, source: str) -> None:
        if automatic(config, name) and name not in values and name not in kept:
            values[name], sources[name] = value, source

    recommended = RECOMMENDED[config.objective]
    for name in ("clip_low", "clip_high", "aggregate"):
        if name not in config.given and name not in kept:
            values[name], sources[name] = getattr(recommended, name), "objective"
    if "none" in config.rewards:  # no reward: the frontier's pass rates are all 0, its draw degenerate
        fill("sampler", "uniform", "default")
    for name, value in task.defaults.items():
        if not (name == "minutes" and not automatic(config, "steps")):
            fill(name, value, "data" if config.data else "task")
    fill("max_new_tokens", DATA_MAX_NEW_TOKENS, "default")
    fill("sampler", DEFAULT_SAMPLER, "default")
    fill("lr", DEFAULT_LR, "default")
    fill("steps", DEFAULT_STEPS, "default")
    current = lambda name: values.get(name, getattr(config, name))  # noqa: E731
    agentic = bool(task.tools or task.env or config.tools or config.env)
    fill("max_turns", 4 if agentic else 1, "default")
    fill("max_episode_tokens", current("max_turns") * (current("max_new_tokens") + 64), "default")
    # the window the run uses (grpo/run/run_state.py), as config.json shows it
    fill("alarm_window", alarm_window_for(planned_steps(current("steps"), current("minutes"))), "default")
    return with_given(dataclasses.replace(config, **values), config.given), sources


def refuse_unread(config: TrainConfig) -> None:
    """A given option that the chosen objective or estimator does not read is an error, not ignored."""
    for name, reader in READERS.items():
        if name in config.given and config.objective not in reader:
            raise ConfigError(f"{name} is read by objective {' or '.join(reader)} only (objective is {config.objective})")
    if "scale" in config.given and config.advantage_estimator not in SCALED:
        raise ConfigError(f"scale is read by the grpo and passk estimators only; {config.advantage_estimator} "
                          "has its own normalisation")


def settle_config(config: TrainConfig, task: Task) -> TrainConfig:
    """The config with what was not given filled (:func:`resolve_config`, without the sources)."""
    return resolve_config(config, task)[0]


def planned_steps(steps: int, minutes: float) -> int:
    """The steps a run plans for: under a time budget the steps that will fit are unknown before the run,
    so BUDGET_STEPS at most."""
    return min(steps, BUDGET_STEPS) if minutes else steps


def alarm_window_for(steps: int) -> int:
    """The automatic trend window: half the run, between 6 and 20 steps."""
    return min(20, max(6, steps // 2))
