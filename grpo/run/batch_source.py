"""Where each step's batch comes from: sampled at the step itself (``EachStep``, the synchronous loop), or
sampled ahead in a thread with a fixed lag (grpo/run/async_batches.py, ``--async-lag K``). Both have one interface, so
the trainer's step reads the same either way:

- ``next(step)``: the batch step trains on, with the times spent waiting for it (none when sampled here);
- ``turn(waits)``: the update's turn on the device (sampling ahead with the own engine: once the thread's ends);
- ``updated(stats)``: the policy changed; the synchronous loop pushes the new weights to the vLLM engine;
- ``drain()``: wait until nothing samples (before an evaluation or a checkpoint: they share the scorer);
- ``close()``: sample nothing more;
- ``state_dict()``/``load_state_dict()``: what a checkpoint holds of it (sampled ahead: the batches not yet
  trained on).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from grpo.learning.step_stats import StepStats
from grpo.run.async_batches import SamplingAhead
from grpo.sampling.rounds import Batch, sample_batch
from grpo.sampling.step_parts import Learner, Sampling
from grpo.system.distributed import full_state_dict


class BatchSource(Protocol):
    """What the trainer's step and run read of a batch source (see the module doc)."""

    def next(self, step: int) -> tuple[Batch, dict[str, float]]: ...
    def turn(self, waits: dict[str, float]) -> AbstractContextManager[None]: ...
    def updated(self, stats: StepStats) -> None: ...
    def drain(self) -> None: ...
    def close(self) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class EachStep:
    """The synchronous loop: batch t is sampled at step t with the weights after update t - 1. With vLLM
    the engine sleeps while the policy updates (its memory goes to the update) and gets each update's
    weights."""

    def __init__(self, sampling: Sampling, learner: Learner) -> None:
        self.sampling, self.learner = sampling, learner

    def next(self, step: int) -> tuple[Batch, dict[str, float]]:
        batch = sample_batch(self.sampling, step)
        if self.sampling.generation.engine is not None:  # on a GPU the update gets vLLM's memory (no-op elsewhere)
            self.sampling.generation.engine.sleep()
        return batch, {}

    @contextmanager
    def turn(self, waits: dict[str, float]) -> Iterator[None]:
        yield  # nothing else uses the device

    def updated(self, stats: StepStats) -> None:
        """Send the updated weights to the vLLM engine, if there is one and they changed."""
        engine, learner = self.sampling.generation.engine, self.learner
        if engine is not None and engine.asleep:  # the gradients' memory goes back before vLLM wakes
            learner.optimizer.zero_grad(set_to_none=True)
        if engine is not None and stats.optimizer_steps:  # the next rollout samples from the new weights
            engine.push(learner.model, full_state_dict(learner.model, learner.world))  # collective under FSDP

    def drain(self) -> None:
        pass  # sampled in the trainer's own thread: nothing is in flight between steps

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {}  # nothing sampled ahead: the sampler's and the RNGs' state is the whole of it

    def load_state_dict(self, state: dict) -> None:
        pass


def batch_source(sampling: Sampling, learner: Learner, lag: int) -> EachStep | SamplingAhead:
    """The synchronous loop for lag 0; else batches sampled ``lag`` updates ahead, in a thread."""
    return SamplingAhead(sampling, learner, lag) if lag else EachStep(sampling, learner)
