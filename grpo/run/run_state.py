"""What a run carries from step to step and through a checkpoint.

The configuration is frozen once the first step starts; what the run learns
about itself later lives here: the held-out history the alarms read, the sampling
temperature under temperature_target (grpo.sampling.step_parts.Temperature, which both sides of a
step read), the count of NaN/inf steps in a row, the seconds trained, and the evaluation
schedule and alarm window, planned before step 1 from the planned steps alone
(never from a measured time). Checkpoints (grpo/run/checkpoint.py) hold all of it, so a
resumed run continues exactly where the unbroken one would be.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpo.run.checkpoint as checkpoint
from grpo.config import TrainConfig
from grpo.config_resolution import alarm_window_for, planned_steps
from grpo.observe.alarm_monitor import AlarmMonitor
from grpo.sampling.step_parts import Learner
from grpo.system.distributed import load_shards, load_training_state, save_shards, training_state
from grpo.system.interrupt import RunStopped

EVALUATIONS = 5  # automatic evaluations during a run's planned steps (the start and the end besides) ...
EVERY_MAX = 5  # ... but at least one every this many steps, so that a long run's alarms can stop it early


@dataclass
class RunState:
    """The run's state between steps (what a checkpoint's ``extra`` holds, with the alarms' own)."""

    step: int = 0  # the last step done
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out accuracy) for the alarms
    bad_in_a_row: int = 0  # steps in a row whose loss or gradient was NaN/inf
    train_seconds: float = 0.0  # seconds of training before this process took over (resumed)
    eval_every: int = 0  # the evaluation schedule (planned_schedule when the config leaves it automatic)
    alarm_window: int = 0  # the alarms' window, fitted to the planned steps when the config leaves it automatic
    alarms: dict | None = None  # the alarms' state in the checkpoint resumed from
    temperature: float = 0.0  # the next step's sampling temperature under temperature_target (0: the config's)

    @classmethod
    def start(cls, config: TrainConfig, *, auto_alarm_window: bool = False) -> RunState:
        """A new run's state; its schedule is fixed here, before step 1, from the plan alone."""
        every, planned = planned_schedule(config.steps, config.minutes)
        window = alarm_window_for(planned) if auto_alarm_window else config.alarm_window
        return cls(eval_every=config.eval_every or every, alarm_window=window)

    @classmethod
    def resumed(cls, saved: dict, config: TrainConfig) -> RunState:
        """From a checkpoint; one written before the schedule moved here holds it in its config."""
        extra = saved.get("schedule", {})
        return cls(step=saved["step"], history=saved["history"], bad_in_a_row=saved["bad_in_a_row"],
                   train_seconds=saved.get("train_seconds", 0.0),
                   eval_every=config.eval_every or extra.get("eval_every", 0),
                   alarm_window=extra.get("alarm_window", config.alarm_window), alarms=saved.get("alarms"),
                   temperature=saved.get("temperature", 0.0))

    def extra(self, monitor: AlarmMonitor, train_seconds: float) -> dict:
        """What a checkpoint written now carries besides weights, optimiser and sampler."""
        return {"history": self.history, "bad_in_a_row": self.bad_in_a_row, "alarms": monitor.state(),
                "train_seconds": train_seconds, "temperature": self.temperature,
                "schedule": {"eval_every": self.eval_every, "alarm_window": self.alarm_window}}


@dataclass
class TimeBudget:
    """--minutes, read before a step's scheduled evaluation: the run stops there when this step's evaluation
    (as long as the latest one took; before any, the start's, which scores the whole held-out set; a
    resumed run's start is read from its checkpoint, so it counts none until it evaluates) and one
    more step (at the mean pace of the steps so far, evaluations left out) would end past the budget. A step
    the clock stops runs no evaluation of its own, so that the run equals --steps of its length (the final
    evaluation follows either way), and no evaluation runs that the budget has no room for."""

    seconds: float  # 60 * minutes; 0: no budget
    trained_before: float  # seconds trained before this process took over (a resumed run's)
    evaluation: float = 0.0  # the latest evaluation's seconds
    evaluating: float = 0.0  # seconds of this process's evaluations during the steps
    start: float = field(default_factory=lambda: TimeBudget.now())

    @staticmethod
    def now() -> float:
        """The clock the budget reads, and its evaluations' seconds are read on (a test replaces it)."""
        return time.perf_counter()

    def trained(self) -> float:
        return self.trained_before + self.now() - self.start

    def spent(self, steps_done: int, evaluates: bool) -> bool:
        """Whether to stop after this step, the ``steps_done``-th of this process (``evaluates``: it is due
        an evaluation)."""
        if not self.seconds:
            return False
        now = self.trained()
        pace = (now - self.trained_before - self.evaluating) / steps_done
        return now + pace + (self.evaluation if evaluates else 0.0) > self.seconds

    def evaluated(self, seconds: float) -> None:
        self.evaluation, self.evaluating = seconds, self.evaluating + seconds


def planned_schedule(steps: int, minutes: float) -> tuple[int, int]:
    """The evaluation schedule and the steps the automatic alarm window is fitted to, from the plan alone.

    EVALUATIONS evaluations during the run, evenly spaced over its planned steps, at least one every
    EVERY_MAX steps (a subset's evaluation costs about a third of a step on this CPU). Under a time budget
    the steps that will fit are unknown before the run, so the plan is BUDGET_STEPS at most: a fast
    machine evaluates more often than it needs to, a slow one still sees the start and three
    evaluations by step 3 * ceil(BUDGET_STEPS / EVALUATIONS). Fixed before step 1 and identical on every
    rank, so the alarms read the same steps however fast the machine runs them.
    """
    planned = planned_steps(steps, minutes)
    return max(1, min(math.ceil(planned / EVALUATIONS), EVERY_MAX)), planned


@dataclass
class Saving:
    """What a checkpoint writes and where: the learner's weights and optimiser, the run's other named parts
    (grpo/run/checkpoint.py; ``batches``, the batch source, is drained first)."""

    learner: Learner
    parts: Mapping[str, object]
    run_dir: Path | None  # where rank 0 writes; None on the other ranks
    enabled: bool  # checkpoints are written (on every process: under FSDP all take part)


def checkpoint_or_stop(saving: Saving, step: int, extra: dict, stop: signal.Signals | None, *,
                       final: bool = False) -> None:
    """Checkpoint on schedule, at the end, or when asked to stop; stop after too many NaN/inf steps.

    ``stop`` is the signal every rank agreed on after this step (StopRequests.agreed), None if none.
    No checkpoint is written after a bad step, so the latest one is the last good state.
    """
    cfg, bad_in_a_row = saving.learner.config, extra["bad_in_a_row"]
    if bad_in_a_row >= cfg.max_bad_steps:
        raise RunStopped(
            f"loss or gradient was NaN/inf in {bad_in_a_row} consecutive steps (the last at step {step}); "
            f"stopped (max_bad_steps={cfg.max_bad_steps}); {where(saving.run_dir)}"
        )
    requested = stop is not None
    due = step % cfg.save_every == 0 or step == cfg.steps or requested or final
    if saving.enabled and due and bad_in_a_row == 0:
        save_checkpoint(saving, step, extra)
    if requested:
        raise RunStopped(f"stopped by {stop.name} after step {step}; {where(saving.run_dir)}",
                         exit_code=128 + int(stop))


def save_checkpoint(saving: Saving, step: int, extra: dict) -> None:
    """Rank 0 writes the whole weights and optimiser state; under FSDP each process writes its
    shards of them into the folder rank 0 begins, which rank 0 then completes."""
    from torch.distributed.checkpoint.api import CheckpointException

    learner, run_dir = saving.learner, saving.run_dir
    world = learner.world
    saving.parts["batches"].drain()  # the batches sampled ahead, and the prompt sampler's state after them
    weights = optimizer = tmp = failure = None
    if world.fsdp:
        tmp = world.broadcast_object(checkpoint.begin(run_dir, step) if run_dir else None)
        try:
            save_shards(learner.model, learner.optimizer, tmp / checkpoint.SHARDS)
        except (OSError, CheckpointException) as err:  # raised on every process when one fails
            failure = f"cannot write the shards of checkpoint {step} into {tmp}: {err}; the run stopped"
    else:
        weights, optimizer = training_state(learner.model, learner.optimizer)
    if run_dir is not None and failure is None:
        try:
            checkpoint.save(run_dir, step, weights=weights, optimizer=optimizer, parts=saving.parts, tmp=tmp,
                            config=learner.config.to_dict(), extra=extra, keep=learner.config.keep_checkpoints)
        except checkpoint.CheckpointError as err:
            failure = f"{err}; the run stopped at step {step}"
    failure = world.broadcast_object(failure)  # every process stops, not rank 0 alone
    if failure:
        raise RunStopped(failure)


def where(run_dir: Path | None) -> str:
    """Where the latest checkpoint is, and how to continue from it."""
    path = checkpoint.latest(run_dir) if run_dir is not None else None
    if path is None:
        return "no checkpoint was written"
    return f"latest checkpoint: {path} (continue with: grpo train --resume {run_dir})"


def restore(learner: Learner, parts: Mapping[str, object], run_dir: Path | None) -> dict:
    """Restore the latest complete checkpoint of run_dir into the learner and the named parts; return what it
    saved beside."""
    path = checkpoint.latest(run_dir) if run_dir is not None else None
    if path is None:
        raise checkpoint.CheckpointError(f"{run_dir} holds no complete checkpoint to resume from")
    checkpoint.remove_partial(run_dir)
    model, optimizer = learner.model, learner.optimizer
    return checkpoint.restore(
        path, model=model, parts=parts,
        load=lambda weights, state, shards: load_shards(model, optimizer, shards) if shards
        else load_training_state(model, optimizer, weights, state))
