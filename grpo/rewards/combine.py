"""Scoring a batch: several rewards, weighted, computed in worker processes with a per-call timeout.

r_i = sum_k w_k * reward_k(completion_i, row_i). Each reward's raw mean is
logged as ``reward/<name>``. A call that raises, returns a non-finite value
or runs past the timeout is an *error*: it is counted (``reward_errors/<name>``),
reported once with its traceback as a warning, and then either scored 0
(``on_error="zero"``) or stops the run (``"raise"``). Never a silent success.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch
from torch import Tensor

from grpo.rewards.resolve import RewardError

RewardFn = Callable[[str, Mapping], float]


class RewardCallError(RewardError):
    """A reward failed and on_error is "raise"."""


@dataclass(frozen=True)
class CallResult:
    """One reward call: its value, or the error (traceback text) that replaced it."""

    value: float
    error: str | None = None
    timed_out: bool = False


def call_reward(fn: RewardFn, text: str, row: Mapping) -> CallResult:
    """Call one reward, turning exceptions and non-finite values into errors."""
    try:
        value = float(fn(text, row))
    except BaseException:  # a reward's own sys.exit() must not end the worker silently either
        return CallResult(0.0, traceback.format_exc())
    if not math.isfinite(value):
        return CallResult(0.0, f"reward returned a non-finite value: {value}")
    return CallResult(value)


def _worker_loop(conn: Connection, fns: Sequence[RewardFn]) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        job_id, k, text, row = job
        conn.send((job_id, call_reward(fns[k], text, row)))


class WorkerPool:
    """Forked worker processes; a worker whose call runs past the timeout is killed and replaced.

    Fork (not spawn) so that any callable works, lambdas and closures included;
    the workers never touch torch or the GPU.
    """

    def __init__(self, fns: Sequence[RewardFn], workers: int, timeout: float) -> None:
        self.fns, self.timeout = list(fns), timeout
        self.ctx = mp.get_context("fork")
        self.workers = [self._start() for _ in range(workers)]

    def _start(self) -> tuple[mp.Process, Connection]:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_loop, args=(child, self.fns), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _replace(self, i: int) -> None:
        proc, conn = self.workers[i]
        proc.kill()
        proc.join()
        conn.close()
        self.workers[i] = self._start()

    def map(self, jobs: Sequence[tuple[int, str, Mapping]]) -> list[CallResult]:
        """Run (reward index, text, row) jobs; results in job order."""
        results: list[CallResult | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, deadline)
        while todo or busy:
            for i in range(len(self.workers)):
                if i not in busy and todo:
                    j = todo.pop()
                    self.workers[i][1].send((j, *jobs[j]))
                    busy[i] = (j, time.monotonic() + self.timeout)
            conns = {self.workers[i][1]: i for i in busy}
            next_deadline = min(d for _, d in busy.values())
            for conn in wait(list(conns), timeout=max(0.0, next_deadline - time.monotonic())):
                i = conns[conn]
                try:
                    j, result = conn.recv()
                except (EOFError, OSError):  # the worker died mid-call (a reward killed it)
                    j, result = busy[i][0], CallResult(0.0, "reward worker process died during the call")
                    self._replace(i)
                results[j] = result
                del busy[i]
            now = time.monotonic()
            for i, (j, deadline) in list(busy.items()):
                if now >= deadline:
                    results[j] = CallResult(0.0, f"reward call timed out after {self.timeout:g} s", timed_out=True)
                    self._replace(i)
                    del busy[i]
        return results  # type: ignore[return-value]

    def close(self) -> None:
        for proc, conn in self.workers:
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=1)
            if proc.is_alive():
                proc.kill()
        self.workers = []


def _unique_names(fns: Sequence[RewardFn]) -> list[str]:
    names: list[str] = []
    for fn in fns:
        base = getattr(fn, "__name__", type(fn).__name__)
        name, n = base, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return names


class RewardScorer:
    """``score(texts, rows, lengths=None, truncated=None) -> (rewards (N,), metrics)``: the trainer's view.

    ``lengths`` (completion tokens) are added to each row as ``completion_tokens``
    with ``max_completion_tokens``, for length-aware rewards such as ``overlong_penalty``;
    ``truncated`` (hit the token limit) as ``truncated``, for answer rewards, which give a cut
    completion 0.
    Rewards with a ``score_batch`` method (a learned reward model) run batched in this process.
    """

    def __init__(
        self,
        fns: Sequence[RewardFn],
        weights: Sequence[float] | None = None,
        *,
        workers: int = 0,
        timeout: float = 30.0,
        on_error: str = "zero",
        max_completion_tokens: int | None = None,
    ) -> None:
        if on_error not in ("zero", "raise"):
            raise RewardError(f"on_error must be 'zero' or 'raise', got {on_error!r}")
        self.fns, self.names = list(fns), _unique_names(fns)
        self.weights = list(weights) if weights else [1.0] * len(self.fns)
        self.on_error, self.max_completion_tokens = on_error, max_completion_tokens
        self.errors = dict.fromkeys(self.names, 0)
        self._warned: set[str] = set()
        pooled = [fn for fn in self.fns if not hasattr(fn, "score_batch")]
        self.pool = WorkerPool(self.fns, workers, timeout) if workers > 0 and pooled else None

    def _raw(self, k: int, texts: Sequence[str], rows: Sequence[Mapping]) -> list[CallResult]:
        fn = self.fns[k]
        if hasattr(fn, "score_batch"):
            try:
                return [CallResult(float(v)) for v in fn.score_batch(texts, rows)]
            except Exception:
                return [CallResult(0.0, traceback.format_exc())] * len(texts)
        if self.pool is not None:
            return self.pool.map([(k, t, r) for t, r in zip(texts, rows, strict=True)])
        return [call_reward(fn, t, r) for t, r in zip(texts, rows, strict=True)]

    def _report(self, name: str, results: Sequence[CallResult]) -> None:
        failed = [r for r in results if r.error is not None]
        if not failed:
            return
        self.errors[name] += len(failed)
        first = failed[0].error.strip()
        if self.on_error == "raise":
            raise RewardCallError(
                f"reward {name} failed on {len(failed)} of {len(results)} completions (on_error='raise'): "
                f"{first.splitlines()[-1]}; stopped before this step's update, so saved state is consistent"
            )
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(
                f"reward {name}: {len(failed)} of {len(results)} calls failed and scored 0 "
                f"(later failures are counted in reward_errors/{name}); first error:\n{first}",
                RuntimeWarning, stacklevel=3,
            )

    def __call__(
        self, texts: Sequence[str], rows: Sequence[Mapping], lengths: Sequence[int] | None = None,
        truncated: Sequence[bool] | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        if truncated is not None:
            rows = [{**r, "truncated": bool(t)} for r, t in zip(rows, truncated, strict=True)]
        if lengths is not None:
            limit = self.max_completion_tokens or max(lengths, default=0)
            rows = [{**r, "completion_tokens": int(n), "max_completion_tokens": limit} for r, n in zip(rows, lengths, strict=True)]
        total = torch.zeros(len(texts))  # (N,)
        metrics: dict[str, float] = {}
        for k, (name, weight) in enumerate(zip(self.names, self.weights, strict=True)):
            results = self._raw(k, texts, rows)
            self._report(name, results)
            raw = torch.tensor([r.value for r in results], dtype=torch.float32)  # (N,)
            total += weight * raw
            metrics[f"reward/{name}"] = raw.mean().item() if len(raw) else 0.0
            metrics[f"reward/{name}_std"] = raw.std().item() if len(raw) > 1 else 0.0
            metrics[f"reward_errors/{name}"] = float(sum(r.error is not None for r in results))
            metrics[f"reward_timeouts/{name}"] = float(sum(r.timed_out for r in results))
        return total, metrics

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def combine_rewards(
    fns: Sequence[RewardFn], weights: Sequence[float] | None = None, **options: object
) -> RewardScorer:
    """Score completions with several rewards; the weighted total and each raw mean (see RewardScorer)."""
    return RewardScorer(fns, weights, **options)
