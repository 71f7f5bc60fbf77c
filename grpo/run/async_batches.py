"""Asynchronous GRPO: the next batches are sampled while the policy trains, with a fixed lag.

With ``async_lag`` K > 0, batch t is sampled with exactly the weights after
update t - 1 - K (the starting weights while t - 1 - K <= 0), every
generation round that dynamic sampling asks for included; K = 0 is the
synchronous loop, which does not use this module. The lag is fixed rather
than "whatever is ready", so a run is determined by its seed and K: every
completion draws from a random stream keyed by its place in the run
(grpo/sampling/random_streams.py), the sampler's copy of the weights is the one named, and the
prompt sampler sees the batches in step order. TRL's ``max_staleness: K`` is
an upper bound on the lag; here it is the lag itself.

A thread of the trainer's process samples, scores and filters the batches
(grpo/sampling/rounds.py) one after another, in step order. With vLLM it pushes each
version to the engine's process first, and vLLM samples beside the update.
With the own engine it samples from a copy of the policy refreshed from each
version, taking turns with the update (``turns``): in one process both would
share the cores, and kernels whose sums depend on the threads they get would
make runs unrepeatable. The trainer hands the thread a version at the start
of each step (``next``), before it updates on the batch sampled K steps
earlier. The loss weighs each token by the truncated importance ratio
between the policy and the sampler's log-probs kept with every token
(grpo/math/algorithm.py, ``tis_weights``): per token by default, which corrects
the lag only in part; ``tis_level="sequence_ratio"`` corrects the law each
completion was drawn from, up to the cap, but not the group statistics nor the
token normaliser computed from the stale draws (see ``tis_weights``).

A prompt drawn for one of the K batches before is not drawn again while
other prompts are left (``avoid``; the uniform sampler may still draw a
prompt twice within one step, as it does without a lag). The prompt
sampler's statistics take each batch's rewards when it is scored, in the
thread. Repeatability rests on the thread and the trainer sharing no random
state: the completions' streams are keyed, and the minibatch order has an
RNG of its own (a reward that draws from Python's global ``random`` would
break it, as it would break a synchronous resume).

The thread and the trainer share the trainer's other parts (the reward
scorer, the tools, the engine), so the trainer waits for the thread to be
idle (``drain``) before it evaluates or writes a checkpoint; a checkpoint
then holds the batches sampled ahead and the sampler's state after them, and
a resumed run continues as the unbroken one (bitwise with the own engine).
A run stopped by its time budget or an alarm drops the batches not yet
sampled; resumed (or continued past its planned steps), the first batches
after it sample with weights less than K updates old, as the log line says.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from grpo.learning.step_stats import StepStats
from grpo.run.checkpoint import CheckpointError
from grpo.sampling.rounds import Batch, sample_batch
from grpo.sampling.step_parts import Learner, Sampling
from grpo.system.distributed import ModelCalls


@dataclass
class Job:
    """A batch to sample: its step, the version of the weights it samples with (the step after whose update
    they were taken; 0: the start), and those weights (the trainable ones, by name; on the CPU for vLLM)."""

    step: int
    version: int
    weights: dict[str, Tensor]


class SamplingAhead:
    """Samples batch t + K in a thread while the trainer updates on batch t (see the module docstring)."""

    def __init__(self, sampling: Sampling, learner: Learner, lag: int) -> None:
        # what it cannot do (torchrun; vLLM with an adapter) was refused before anything loaded (grpo/refusals.py)
        self.learner, self.lag, self.engine = learner, lag, sampling.generation.engine
        # the thread's own model, in a copy of the generation record: for the own engine a copy of the policy,
        # refreshed at each version; for vLLM a stand-in (the engine holds the weights); the rest of what
        # sampling reads is shared
        if self.engine is None:
            model = copy.deepcopy(learner.model).eval().requires_grad_(False)
            generation = replace(sampling.generation, model=model, policy=ModelCalls(model))
        else:
            generation = replace(sampling.generation, model=nn.Module())
        self.sampling = replace(sampling, generation=generation)
        self.held: int | None = None  # the version of the weights the sampler holds (None: not known)
        self.next_step = 1  # the next batch to hand to the thread
        # the batches sampled and not yet trained on: step -> (batch, version, the thread's seconds for it)
        self.ready: dict[int, tuple[Batch, int, dict[str, float]]] = {}
        self.prompts: dict[int, set[int]] = {}  # the prompts each of the last K batches sampled drew, by step
        self.waited = 0.0  # seconds the thread waited for weights since the trainer last took a batch
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.done = threading.Condition()
        self.busy = 0  # jobs handed over and not finished
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        # the own engine's sampling and the update take turns: in one process they would share the same cores,
        # and their kernels' sums then depend on how many threads each got (not bitwise repeatable); vLLM's
        # sampling runs in its own process, beside the update
        self.turns: AbstractContextManager = threading.Lock() if self.engine is None else nullcontext()

    # ---- the trainer's side ----

    def next(self, step: int) -> tuple[Batch, dict[str, float]]:
        """Hand the thread the batches up to step + K (at most the run's last step) with the current weights,
        then wait for batch ``step``; return it with its lag and the times: the trainer's waits, and the
        thread's own for the batch (its push in time_sync), not the trainer's wait for it."""
        todo = range(self.next_step, min(step + self.lag, self.learner.config.steps) + 1)
        weights = self._weights() if len(todo) else {}  # one copy, shared by the jobs of this version
        late = [s for s in todo if step - 1 > max(0, s - 1 - self.lag)]
        if late:  # resumed after a stop that dropped them, or continued past the planned steps
            print(f"sampling ahead: batches {late[0]}-{late[-1]} sample with the weights after step {step - 1}, "
                  f"fewer than async_lag {self.lag} updates old (the run stopped before they were sampled)",
                  flush=True)
        for s in todo:
            self._submit(Job(s, step - 1, weights))
        self.next_step = max(self.next_step, todo.stop)
        t0 = time.perf_counter()
        with self.done:
            self.done.wait_for(lambda: step in self.ready or self.error is not None)
            if step not in self.ready:  # a later batch's failure waits for the step it belongs to
                self._raise()
            batch, version, seconds = self.ready.pop(step)
            waited_trainer, self.waited = self.waited, 0.0
        lag = step - 1 - version
        if lag > self.lag:  # never trained on: the correction and the resume assume at most K updates between
            raise RuntimeError(f"batch {step} was sampled with the weights after step {version}: {lag} updates "
                               f"old, more than async_lag {self.lag}")
        seconds = dict(seconds)
        seconds["time_reward"] = seconds.pop("time_sample") - sum(r.seconds_generate for r in batch.rounds)
        return batch, {"async_lag": float(lag), "time_wait_sampler": time.perf_counter() - t0,
                       "time_wait_trainer": waited_trainer, **seconds}

    @contextmanager
    def turn(self, waits: dict[str, float]) -> Iterator[None]:
        """The update's turn: with the own engine, once the thread's sampling turn ends (counted in waits)."""
        t0 = time.perf_counter()
        with self.turns:
            waits["time_wait_sampler"] += time.perf_counter() - t0
            yield

    def updated(self, stats: StepStats) -> None:
        """Nothing: the thread takes the weights at the next step's start (``next``)."""

    def drain(self) -> None:
        """Wait until every batch handed over is sampled: the thread then touches nothing of the trainer's."""
        with self.done:
            self.done.wait_for(lambda: self.busy == 0 or self.error is not None)
            self._raise()

    def _weights(self) -> dict[str, Tensor]:
        """A copy of the weights now: the trainable ones for the own engine's copy, all of them for vLLM."""
        model = self.learner.model
        if self.engine is not None:
            return {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
        return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    def _submit(self, job: Job) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="grpo-sampling-ahead", daemon=True)
            self.thread.start()
        with self.done:
            self.busy += 1
        self.jobs.put(job)

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    # ---- the thread ----

    def _work(self) -> None:
        while True:
            t0 = time.perf_counter()
            job = self.jobs.get()
            if job is None:
                return
            with self.done:
                self.waited += time.perf_counter() - t0  # idle: no weights to sample the next batch with yet
            try:
                t0 = time.perf_counter()
                with self.turns:  # the own engine: the update's turn ends first
                    with self.done:
                        self.waited += time.perf_counter() - t0
                    batch, seconds = self._sample(job)
            except BaseException as err:  # noqa: BLE001 - raised again in the trainer's thread
                with self.done:
                    self.error = err
                    self.done.notify_all()
                return
            with self.done:
                self.ready[job.step] = (batch, job.version, seconds)
                self.busy -= 1
                self.done.notify_all()

    def _sample(self, job: Job) -> tuple[Batch, dict[str, float]]:
        """Batch ``job.step`` from the weights of ``job.version``, avoiding the prompts in flight: those of
        batches step - K .. step - 1, sampled and not yet trained on when these weights were made (fixed by
        the step alone, however far the trainer has got, so that the draws do not depend on timing)."""
        t0 = time.perf_counter()
        if self.held != job.version:
            self._load(job.weights)
            self.held = job.version
        t_pushed = time.perf_counter()
        self.prompts = {s: p for s, p in self.prompts.items() if s >= job.step - self.lag}
        batch = sample_batch(self.sampling, job.step, avoid=set().union(*self.prompts.values()))
        self.prompts[job.step] = {i for r in batch.rounds for i in r.prompts}
        return batch, {"time_sync": t_pushed - t0, "time_sample": time.perf_counter() - t_pushed}

    @torch.no_grad()
    def _load(self, weights: dict[str, Tensor]) -> None:
        if self.engine is not None:
            self.engine.push(self.learner.model, weights)
            return
        params = dict(self.sampling.generation.model.named_parameters())
        for name, value in weights.items():
            params[name].copy_(value)

    # ---- a checkpoint's part ----

    def state_dict(self) -> dict:
        """The batches sampled ahead and not yet trained on (the caller drained first: see run_state.py)."""
        self.drain()
        return {"lag": self.lag, "next_step": self.next_step, "ready": dict(self.ready),
                "prompts": dict(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        if state["lag"] != self.lag:
            raise CheckpointError(f"the checkpoint sampled ahead with async_lag {state['lag']}, this run has "
                                  f"{self.lag}: resume with the same lag")
        device = self.sampling.generation.device  # checkpoints load on the CPU
        self.ready = {step: (batch.to(device), version, seconds)
                      for step, (batch, version, seconds) in state["ready"].items()}
        self.next_step, self.prompts = state["next_step"], dict(state["prompts"])
        self.held = None  # whatever the sampler holds now, the next batch's weights are loaded first

    def close(self) -> None:
        """End the thread once its current batch is done; the batches handed over and not started are
        dropped (a resumed run samples them with the weights it has then)."""
        if self.thread is None:
            return
        dropped = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                dropped.append(job.step)
        self.jobs.put(None)
        try:
            self.thread.join()
        finally:
            self.thread = None
            with self.done:
                self.busy = 0
                self.next_step = min(dropped, default=self.next_step)
