"""Checkpoints: atomic save, exact resume.

A checkpoint is a folder ``RUN_DIR/checkpoints/step-00000010/`` holding

- ``weights.pt``: the trainable parameters (all of them, or only the LoRA adapter),
  whole and by name;
- ``state.pt``: every other piece of state a step consumes, with its ``format``: the
  optimiser's (whole, keyed by parameter name), the global RNGs (Python, NumPy, torch
  and CUDA), the run's named parts (``parts``: the prompt sampler's RNG and, when
  sampling runs ahead, the minibatch order's; the prompt sampler; the draw counts;
  the screen, if any; the generation totals; the batches sampled ahead), the run's
  own state (``extra``: grpo/run/run_state.py), and how long the run's log files were;
- ``meta.json``: the step and the config, written last.

It is built in a hidden temporary folder; every file and the folder are fsynced
and the folder is then renamed into place, so a folder named ``step-N`` is
always complete, whenever the process dies. The last ``keep`` are kept.

Weights and optimiser state are whole, not one process's share, and rank 0
writes them; under FSDP each process instead writes its own shards of them
with ``torch.distributed.checkpoint`` into ``shards/`` (in place of
``weights.pt`` and the optimiser's part of ``state.pt``), into the hidden
folder that rank 0 begins and then completes, so the processes need a
filesystem they share. Either kind resumes at any number of processes, with
or without FSDP (grpo/system/distributed.py reshards them).

The caller names the parts it saves (grpo/run/trainer.py, ``checkpoint_parts``): each a
``random.Random``, a ``torch.Generator`` or a :class:`Stateful` (an object with
``state_dict``/``load_state_dict``). A resumed run must name the same ones; a part
added later raises FORMAT and gets a case in :func:`upgrade`, so a checkpoint of
the earlier format still resumes. The optimiser is saved apart: its own
state_dict is keyed by position and, under FSDP, holds one process's shards, so
the caller passes its whole state by name.

Not restored: TensorBoard event files (a resumed run appends after the killed
one's tail, which TensorBoard shows as a second line over the same steps).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import tempfile
import types
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn

CHECKPOINTS = "checkpoints"
WEIGHTS, STATE, META, SHARDS = "weights.pt", "state.pt", "meta.json", "shards"
LOG_FILES = ("metrics.jsonl", "completions.jsonl")
_NAME = re.compile(r"^step-(\d+)$")
_TMP = ".tmp-"
FORMAT = 2  # state.pt's layout (upgrade reads the older ones)


# The modules that held grpo's classes before the package was put in folders by part (CHANGELOG, issue 55):
# a state.pt written then names them for the objects it pickled (the batches sampled ahead under
# --async-lag), and is read under the new names.
MOVED = {f"grpo.{old}": f"grpo.{new}" for old, new in {
    "ahead": "run.async_batches", "alarm_noise": "observe.alarm_noise", "alarms": "observe.alarms",
    "algorithm": "math.algorithm", "batch": "sampling.rounds", "checkpoint": "run.checkpoint",
    "combinations": "refusals", "distributed": "system.distributed", "episode_scores": "sampling.episode_scores",
    "episodes": "sampling.episodes", "evaluate": "sampling.evaluate", "forward": "sampling.forward",
    "heap": "system.heap_settings", "heldout": "observe.heldout", "interrupt": "system.interrupt",
    "launcher": "system.launcher", "logprobs": "learning.logprobs", "memory": "run.memory",
    "memory_check": "run.memory_check", "metrics": "observe.metrics", "objectives": "math.objectives",
    "packed": "sampling.packed_linear", "parent_death": "system.parent_death", "preflight": "run.preflight",
    "process": "run.process_setup", "progress": "observe.progress", "prompts": "sampling.prompts",
    "repeat": "run.repeat", "report": "observe.report", "rollout": "sampling.rollout",
    "run_state": "run.run_state", "sampler": "sampling.prompt_samplers", "screen": "sampling.screen",
    "setup": "run.build", "sides": "sampling.step_parts", "source": "run.batch_source",
    "step_metrics": "run.step_metrics", "streams": "sampling.random_streams", "teacher": "learning.teacher",
    "tools": "sampling.tools", "trainer": "run.trainer", "turns": "sampling.turn_takers",
    "update": "learning.update", "user_code": "system.user_code", "vllm_device": "sampling.vllm_device",
    "vllm_engine": "sampling.vllm_engine", "workers": "system.workers",
}.items()}


class _MovedNames(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        for old, new in MOVED.items():
            if module == old or module.startswith(old + "."):
                module = new + module[len(old):]
                break
        return super().find_class(module, name)


_PICKLE = types.SimpleNamespace(__name__="pickle", Unpickler=_MovedNames, load=pickle.load)


def read_state(path: Path) -> dict:
    """A checkpoint's state.pt, the run's own file: it holds RNG tuples and arbitrary sampler states, so a full
    unpickle, with the modules' names of before the move read as today's."""
    return torch.load(path / STATE, map_location="cpu", weights_only=False, pickle_module=_PICKLE)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names it."""


@runtime_checkable
class Stateful(Protocol):
    """Anything whose state a checkpoint captures: the optimiser, a prompt sampler, ..."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first. A folder counts only once renamed and holding meta.json."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / META).is_file()]
    return [p for _, p in sorted(found)]


def latest(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def read_meta(path: Path) -> dict:
    try:
        return json.loads((path / META).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable: {err}") from err


# ---- capturing and restoring state ----


def check_weights(model: nn.Module, weights: dict[str, Tensor]) -> None:
    """Raise CheckpointError unless ``weights`` names exactly the model's trainable parameters."""
    names: dict[int, list[str]] = {}  # parameter -> its names (tied weights have several)
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            names.setdefault(id(p), []).append(name)
    known = {name for group in names.values() for name in group}
    missing = [group[0] for group in names.values() if not any(name in weights for name in group)]
    odd = sorted(set(weights) - known) + missing
    if odd:
        raise CheckpointError(
            f"checkpoint weights do not fit the model ({len(odd)} names differ, e.g. {odd[0]!r}); "
            "was it written with another model or lora_rank?"
        )


def global_rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        # the current GPU's alone (a list of one): each process uses one, and a resume may see fewer GPUs than
        # the run that saved (every visible GPU's state would not restore on a machine with fewer)
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_initialized() else [],
    }


def set_global_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_initialized():  # the first: the saving process's own GPU (older
        torch.cuda.set_rng_state(state["cuda"][0])  # checkpoints listed every visible GPU's, its own first)


def capture(parts: Mapping[str, object]) -> dict[str, object]:
    """The state of each named part: a ``random.Random``'s, a ``torch.Generator``'s, or a Stateful's."""
    out: dict[str, object] = {}
    for name, value in parts.items():
        if isinstance(value, random.Random):
            out[name] = value.getstate()
        elif isinstance(value, torch.Generator):
            out[name] = value.get_state()
        else:
            out[name] = value.state_dict()
    return out


def upgrade(state: dict) -> dict:
    """A state.pt of any format as the current one. Format 1 (before the format was named) saved whatever
    stateful attributes the trainer had, under their names: the batches sampled ahead as ``ahead`` (none
    for the synchronous loop, whose source has no state), no ``sampler`` for the uniform one (it had no
    state_dict), and no ``totals`` before RunTotals existed."""
    if state.get("format", 1) == FORMAT:
        return state
    parts = dict(state["parts"])
    parts["batches"] = parts.pop("ahead", {})
    parts.setdefault("sampler", {})
    return {**state, "format": FORMAT, "parts": parts, "fresh": set() if "totals" in parts else {"totals"}}


def restore_parts(parts: Mapping[str, object], saved: dict[str, object], *, fresh: Collection[str] = ()) -> None:
    """Load each named part's saved state; those in ``fresh`` (absent from an older format) keep theirs."""
    expected = {name for name in parts if name not in fresh}
    if expected != set(saved):
        raise CheckpointError(f"checkpoint holds state for {sorted(saved)} but this run has {sorted(expected)}")
    for name in expected:
        value = parts[name]
        if isinstance(value, random.Random):
            value.setstate(saved[name])
        elif isinstance(value, torch.Generator):
            value.set_state(saved[name])
        else:
            value.load_state_dict(saved[name])


# ---- writing ----


def _fsync(fd: int) -> None:
    os.fsync(fd)


def _write_file(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write one file and force it to disk. Every byte of a checkpoint goes through here."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        _fsync(f.fileno())


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def remove_partial(run_dir: Path) -> None:
    """Delete temporary folders left by a run that died while writing or pruning."""
    root = checkpoint_dir(run_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(_TMP):
                shutil.rmtree(p, ignore_errors=True)


def begin(run_dir: Path, step: int) -> Path:
    """The hidden folder checkpoint ``step`` is built in (earlier partial ones removed first)."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    remove_partial(run_dir)
    return Path(tempfile.mkdtemp(prefix=f"{_TMP}step-{step:08d}-", dir=root))


def save(
    run_dir: Path, step: int, *, weights: dict[str, Tensor] | None, optimizer: dict | None,
    parts: Mapping[str, object], config: dict, extra: dict, keep: int, tmp: Path | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and keep only the last ``keep``; return its folder.

    ``weights`` and ``optimizer`` are the whole trainable parameters and optimiser state, by name;
    or None when ``tmp`` (from :func:`begin`) already holds them as shards (``SHARDS``). ``parts``: the
    run's other stateful parts, by name (their state is captured here).

    On any OSError (disk full, ...) the partial folder is removed, earlier checkpoints are
    untouched, and CheckpointError says which one is the latest complete.
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step-{step:08d}"
    tmp = tmp or begin(run_dir, step)
    logs = {name: _synced_size(Path(run_dir) / name) for name in LOG_FILES}
    state = {"format": FORMAT, "rng": global_rng_state(), "parts": capture(parts), "optimizer": optimizer,
             "logs": logs, "extra": extra}
    try:
        if weights is not None:
            _write_file(tmp / WEIGHTS, lambda f: torch.save(weights, f))
        _write_file(tmp / STATE, lambda f: torch.save(state, f))
        meta = json.dumps({"step": step, "config": config}, indent=2).encode()
        _write_file(tmp / META, lambda f: f.write(meta))
        _sync_dir(tmp)
        if final.exists():
            _discard(final)
        os.replace(tmp, final)
        _sync_dir(root)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest(run_dir)
        where = f"the latest complete checkpoint is still {previous}" if previous else "no complete checkpoint exists"
        reason = err.strerror or str(err)
        raise CheckpointError(f"cannot write checkpoint {final}: {reason}; {where}") from err
    for old in complete_checkpoints(run_dir)[:-keep]:
        _discard(old)
    return final


def _discard(path: Path) -> None:
    """Remove a checkpoint: rename it out of sight first, so a kill mid-delete leaves no half folder named step-N."""
    doomed = path.with_name(f"{_TMP}del-{path.name}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _synced_size(path: Path) -> int:
    """The log's length, after forcing it to disk so a resumed run finds at least that much."""
    if not path.is_file():
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)
    return path.stat().st_size


# ---- resuming ----


def restore(
    path: Path, *, model: nn.Module, parts: Mapping[str, object],
    load: Callable[[dict | None, dict | None, Path | None], None],
) -> dict:
    """Load checkpoint ``path``: ``load(weights, optimizer state, None)`` (whole, by name) or, for a sharded
    one, ``load(None, None, its shards' folder)``; then the named parts' state (a checkpoint of any format:
    :func:`upgrade`); cut the run's logs back to it; return its extra."""
    shards = path / SHARDS if (path / SHARDS).is_dir() else None
    try:
        weights = None if shards else torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
        state = read_state(path)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ImportError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {path} is unreadable: {err}") from err
    if weights is not None:
        check_weights(model, weights)
    state = upgrade(state)
    load(weights, state["optimizer"], shards)
    restore_parts(parts, state["parts"], fresh=state.get("fresh", ()))
    set_global_rng_state(state["rng"])
    run_dir = path.parent.parent
    for name, size in state["logs"].items():
        _truncate(run_dir / name, size)
    return {"step": read_meta(path)["step"], **state["extra"]}


def _truncate(path: Path, size: int) -> None:
    """Drop what a killed run logged after its checkpoint (never lengthen the file)."""
    if path.is_file() and path.stat().st_size > size:
        with open(path, "r+b") as f:
            f.truncate(size)
