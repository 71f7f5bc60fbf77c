"""The run's two ends around the loop (grpo/run/trainer.py): its start (a resumed run's state, the held-out
accuracy before training) and its end (the summary, summary.json and the final model)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from grpo.config import TrainConfig
from grpo.models import save_model
from grpo.observe.heldout import full_evaluation
from grpo.run.preflight import PreflightReport, preflight_summary
from grpo.run.repeat import environment, repeat_options
from grpo.run.run_state import RunState, restore
from grpo.run.step_metrics import RunLog, RunTotals
from grpo.sampling.evaluate import EvalResult
from grpo.sampling.step_parts import Learner, Sampling, Temperature
from grpo.sampling.vllm_engine import VLLMEngine
from grpo.system.distributed import World, full_state_dict
from grpo.tasks import Task


def resumed_state(learner: Learner, parts: Mapping[str, object], run_dir: Path | None, engine: VLLMEngine | None,
                  model: nn.Module, world: World, config: TrainConfig, sources: Mapping[str, str],
                  temperature: Temperature) -> RunState:
    """Restore the latest complete checkpoint of run_dir; the engine samples from its weights."""
    saved = restore(learner, parts, run_dir)
    if engine is not None:  # collective under FSDP
        engine.push(model, full_state_dict(model, world))
    state = RunState.resumed(saved, config)
    if sources.get("minutes") == "resume":  # --minutes given on resume: that long from now
        state.train_seconds = 0.0
    if state.temperature:  # temperature_target's, where the run stopped
        temperature.value = state.temperature
    return state


def first_evaluation(sampling: Sampling, log: RunLog, state: RunState, heldout_size: int) -> EvalResult:
    """The held-out accuracy before training (a resumed run's comes from its checkpoint)."""
    if state.history:
        return EvalResult(accuracy=state.history[0][1], size=heldout_size)
    first, record = full_evaluation(sampling, log.bar)
    state.history.append((0, first.accuracy))
    log.record(0, record)
    log.bar.print(f"step 0 held-out: {first.describe()}")
    return first


def run_summary(config: TrainConfig, sources: Mapping[str, str], task: Task, totals: RunTotals, state: RunState,
                log: RunLog, preflight: PreflightReport | None, metrics: dict[str, float], heldout_size: int, *,
                first: EvalResult, last: EvalResult, stopped: str | None, out_of_time: bool,
                train_seconds: float, start: float) -> dict:
    """summary.json's content: the held-out accuracy before and after, how the run ended, its alarms, and
    what it takes to repeat it (``start``: the run's perf_counter at its start)."""
    return {
        "heldout_accuracy_start": first.accuracy, "heldout_accuracy_end": last.accuracy,
        "heldout_size": heldout_size, "heldout_start": first.metrics(),
        "heldout_end": last.metrics(), "steps": state.step, "steps_planned": config.steps,
        "minutes": config.minutes, "out_of_time": out_of_time, "stopped_early": stopped,
        "train_seconds": round(train_seconds, 2), "wall_seconds": round(time.perf_counter() - start, 2),
        "reward_mean_last": metrics.get("reward_mean"), "alarms": log.raised, "alarm_messages": log.messages,
        "notes": log.notes, "little_signal": log.little_signal(),
        "eval_every": state.eval_every, "alarm_window": state.alarm_window,
        "preflight": preflight_summary(preflight), "generation": totals.summary(),
        "data": dict(task.data) or None,  # a data source's splits as read, the overlap removed
        "repeat": repeat_options(config, sources, state, out_of_time=out_of_time),
        "environment": environment(),
    }


def save_final(model: nn.Module, tokenizer: object, world: World, config: TrainConfig, run_dir: Path | None,
               main_dir: Path | None, summary: dict) -> None:
    """The final model (gathered under FSDP, written by rank 0) and summary.json (``main_dir``: run_dir on
    rank 0, None on the other ranks)."""
    if run_dir is not None and config.save_model:
        state = full_state_dict(model, world)  # collective under FSDP
        if world.is_main:
            save_model(model, tokenizer, run_dir / "model", state_dict=state)
    if main_dir is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
