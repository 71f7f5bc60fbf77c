"""What can make two runs of one command differ, said and recorded (docs/gpu.md, "What is the same, and
what is not"): the choices a measurement made on this machine. Under a time budget the pre-flight check's
pace sets the step budget's amendments (max_new_tokens, max_gen_rounds, group_size) and the clock sets the
last step; the memory check's prediction, against the memory free now, sets micro_batch_tokens, gradient
checkpointing and eval_batch_size; torch's thread count, unless given, is the machine's. Everything else is
a function of the options and the seed. So a run says in one line what was measured, and its end gives
the options that repeat it step for step (``repeat``: each measured value given as an option, with no
clock the steps the clock stopped it at, else those it planned), with the environment it ran in."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from grpo.config import USER_SOURCES, TrainConfig

if TYPE_CHECKING:
    from grpo.run.run_state import RunState


def measured_line(config: TrainConfig, sources: Mapping[str, str]) -> str | None:
    """The run's one line on what a measurement chose; None where nothing was."""
    said = [f"{who} chose " + ", ".join(f"{name} {getattr(config, name)}" for name in names)
            for who, names in (("the pre-flight check", _measured(config, sources, "preflight")),
                               ("the memory check", _measured(config, sources, "memory"))) if names]
    if not config.threads:
        said.append(f"torch uses {torch.get_num_threads()} threads ({_threads_from()})")
    if config.minutes:
        said.append(f"the clock ends the run ({config.minutes:g} minutes)")
    if not said:
        return None
    return ("measured on this machine: " + "; ".join(said)
            + " (summary.json's repeat, and grpo train's last lines, give the options that repeat it)")


def repeat_options(config: TrainConfig, sources: Mapping[str, str], state: RunState, *, out_of_time: bool
                   ) -> dict[str, object]:
    """The options that, added to the command, repeat the run step for step on a machine like this one
    (the same CPU vector unit and library versions: docs/gpu.md): the values a measurement chose; under a
    time budget, no clock and the planned steps (the steps it ran, ``state.step``, where the clock,
    ``out_of_time``, ended it; an alarm stops the repeat where it stopped the run), with the evaluation
    schedule and alarm window it planned where they were automatic, and no pre-flight check (what it chose
    is given); the episode cap where the token limit was amended after it was derived from it; torch's
    thread count where none was given."""
    names = _measured(config, sources, "preflight") + _measured(config, sources, "memory")
    out: dict[str, object] = {name: getattr(config, name) for name in sorted(names)}
    if "max_new_tokens" in out and sources.get("max_episode_tokens") not in USER_SOURCES:
        out["max_episode_tokens"] = config.max_episode_tokens
    if config.minutes:  # the pre-flight check chose what it could; it has nothing left to choose
        out.update(steps=state.step if out_of_time else config.steps, minutes=0,
                   **({"preflight": "off"} if config.preflight != "off" else {}))
        automatic = {"eval_every": config.eval_every == 0,  # 0, given or not, plans it from the steps
                     "alarm_window": not config.alarm_window or sources.get("alarm_window") not in USER_SOURCES}
        out.update({name: getattr(state, name) for name in ("eval_every", "alarm_window") if automatic[name]})
    if not config.threads:
        out["threads"] = torch.get_num_threads()
    return out


def _threads_from() -> str:
    """Where torch's default thread count came from: OMP_NUM_THREADS (which --nproc's launcher sets to 1
    unless it was set) or this machine's cores."""
    if os.environ.get("OMP_NUM_THREADS"):
        return f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    return "this machine's default"


def as_options(values: Mapping[str, object]) -> str:
    """``repeat_options`` as a command line's options: --steps 26 --minutes 0 ..."""
    def one(name: str, value: object) -> str:
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            return option if value else "--no-" + option[2:]
        return f"{option} {value:g}" if isinstance(value, float) else f"{option} {value}"

    return " ".join(one(name, value) for name, value in values.items())


def environment() -> dict[str, object]:
    """What a run's numbers also depend on: torch's threads, the library versions, the CPU's vector unit."""
    import transformers

    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def _measured(config: TrainConfig, sources: Mapping[str, str], source: str) -> list[str]:
    """The options ``source`` amended by a measurement. The pre-flight check's count only under a time
    budget: its token limit, fitted to the completion lengths it sampled, follows the options and the seed
    as the run's steps do; its step budget's amendments follow its pace."""
    if source == "preflight" and not config.minutes:
        return []
    return sorted(name for name, where in sources.items() if where == source)
