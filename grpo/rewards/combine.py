"""Scoring a batch: several rewards, weighted, computed in worker processes with a per-call timeout.

r_i = sum_k w_k * reward_k(completion_i, row_i). Each reward's raw mean over
the calls that gave a verdict is logged as ``reward/<name>``. A call that raises, returns a non-finite value
or runs past the timeout is an *error*: it is counted (``reward_errors/<name>``),
reported once with its traceback as a warning, and then either makes its row's
total NaN (``on_error="zero"``: the row errored, and training leaves it out of
the loss and of its group's statistics; evaluation scores it 0) or stops the
run (``"raise"``). Never a silent success.
"""

from __future__ import annotations

import math
import struct
import traceback
import warnings
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection

import torch
from torch import Tensor

from grpo.rewards.base import RewardError, RewardFn
from grpo.rewards.styles import CallResult, call_batch, detect_style
from grpo.system.workers import ForkPool


class RewardCallError(RewardError):
    """A reward failed and on_error is "raise"."""


# A job for a worker: (reward index, texts, rows, completion token ids or None).
Job = tuple[int, Sequence[str], Sequence[Mapping], "Sequence[Sequence[int]] | None"]


def _worker_loop(conn: Connection, fns: Sequence[RewardFn], styles: Sequence[str]) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        job_id, k, texts, rows, ids = job
        conn.send((job_id, call_batch(fns[k], styles[k], texts, rows, ids)))


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
    """``score(texts, rows, lengths=None, completion_ids=None, truncated=None) -> (rewards (N,), metrics)``:
    the trainer's view of the rewards; NaN where a call failed (the row errored).

    Each function is called in its style (``styles``; default: read from its signature, see
    grpo.rewards.styles): trl-style ones once per batch, split into one chunk per worker, the
    others once per completion. A None value (trl style) adds nothing to the total and is left
    out of that function's mean and std; ``reward_none/<name>`` counts them.
    ``lengths`` (completion tokens) are added to each row as ``completion_tokens``
    with ``max_completion_tokens`` (the call's, else the scorer's), for length-aware rewards such as
    ``overlong_penalty``;
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
        styles: Sequence[str] | None = None,
    ) -> None:
        if on_error not in ("zero", "raise"):
            raise RewardError(f"on_error must be 'zero' or 'raise', got {on_error!r}")
        self.fns, self.names = list(fns), _unique_names(fns)
        self.weights = list(weights) if weights else [1.0] * len(self.fns)
        self.styles = list(styles) if styles is not None else [detect_style(fn) for fn in self.fns]
        self.workers = workers
        self.on_error, self.max_completion_tokens = on_error, max_completion_tokens
        self.errors = dict.fromkeys(self.names, 0)
        self._warned: set[str] = set()
        self._extra_keys: dict[str, list[str]] = {name: [] for name in self.names}
        pooled = [fn for fn in self.fns if not hasattr(fn, "score_batch")]
        self.pool = ForkPool(_worker_loop, (self.fns, self.styles), workers, timeout) if workers > 0 and pooled else None

    def _jobs(self, k: int, texts: Sequence[str], rows: Sequence[Mapping],
              ids: Sequence[Sequence[int]] | None) -> list[Job]:
        """A trl-style function gets one contiguous chunk per worker; the others one completion per job."""
        n = len(texts)
        size = -(-n // max(self.workers, 1)) if self.styles[k] == "trl" else 1
        return [(k, texts[i : i + size], rows[i : i + size], ids[i : i + size] if ids is not None else None)
                for i in range(0, n, max(size, 1))]

    def _raw(self, k: int, texts: Sequence[str], rows: Sequence[Mapping],
             ids: Sequence[Sequence[int]] | None = None) -> list[CallResult]:
        fn = self.fns[k]
        if hasattr(fn, "score_batch"):
            try:
                values = [float(v) for v in fn.score_batch(texts, rows)]
                return [CallResult(v) if math.isfinite(v) else
                        CallResult(0.0, f"reward model returned a non-finite value: {v}") for v in values]
            except Exception:
                return [CallResult(0.0, traceback.format_exc())] * len(texts)
        if self.pool is not None:
            jobs = self._jobs(k, texts, rows, ids)

            def failed(j: int, timed_out: bool) -> list[CallResult]:  # the job's every completion fails
                why = (f"reward call timed out after {self.pool.timeout:g} s" if timed_out
                       else "reward worker process died during the call")
                return [CallResult(0.0, why, timed_out=timed_out)] * len(jobs[j][1])

            return [r for chunk in self.pool.map(jobs, failed) for r in chunk]
        return call_batch(fn, self.styles[k], texts, rows, ids)

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
                f"reward {name}: {len(failed)} of {len(results)} calls failed: their rows errored and are left out "
                f"of training (evaluation scores them 0; later failures are counted in reward_errors/{name}); "
                f"first error:\n{first}",
                RuntimeWarning, stacklevel=3,
            )

    def __call__(
        self, texts: Sequence[str], rows: Sequence[Mapping], lengths: Sequence[int] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        truncated: Sequence[bool] | None = None, max_completion_tokens: int | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The completions' rewards (N,; NaN where a call failed) and the metrics. ``max_completion_tokens``:
        the token limit they were sampled under (default: the scorer's own, else the longest length)."""
        if truncated is not None:
            rows = [{**r, "truncated": bool(t)} for r, t in zip(rows, truncated, strict=True)]
        if lengths is not None:
            limit = max_completion_tokens or self.max_completion_tokens or max(lengths, default=0)
            rows = [{**r, "completion_tokens": int(n), "max_completion_tokens": limit} for r, n in zip(rows, lengths, strict=True)]
        total = torch.zeros(len(texts))  # (N,)
        errored = torch.zeros(len(texts), dtype=torch.bool)  # (N,)
        metrics: dict[str, float] = {}
        for k, (name, weight) in enumerate(zip(self.names, self.weights, strict=True)):
            results = self._raw(k, texts, rows, completion_ids)
            self._report(name, results)
            raw = torch.tensor([math.nan if r.value is None or r.error is not None else r.value for r in results],
                               dtype=torch.float32)  # (N,) NaN: no verdict from this function (None, or a failed call)
            total += weight * torch.nan_to_num(raw, nan=0.0)
            errored |= torch.tensor([r.error is not None for r in results], dtype=torch.bool)
            metrics.update(self._metrics(k, raw, results))
        return total.masked_fill(errored, math.nan), metrics

    def checker_scores(self, texts: Sequence[str], rows: Sequence[Mapping]) -> list[float]:
        """Each completion's weighted total, as a checker's score (evaluation, pre-flight, the step's
        accuracy): a call that fails or passes the time limit scores 0 (training leaves such rows out)."""
        return self(texts, rows)[0].nan_to_num(0.0).tolist()

    def _metrics(self, k: int, raw: Tensor, results: Sequence[CallResult]) -> dict[str, float]:
        """One function's mean and std over the samples it gave a verdict on (a failed call is none: it
        is left out, as its row is from ``reward_mean``), its error and timeout counts,
        None counts (trl style) and the means of the extra numbers a verl-style dict returned.

        The keys stay the same from batch to batch (an extra key once seen is always logged),
        because the trainer sums these values across processes and rounds key by key.
        """
        name = self.names[k]
        scored = raw[~raw.isnan()].double()  # (M,) M <= N: the samples this function scored; float64, so
        # that its mean and std pool over processes and rounds as exactly as one batch's (pool_score_metrics)
        out = {
            f"reward/{name}": scored.mean().item() if len(scored) else 0.0,
            f"reward/{name}_std": scored.std().item() if len(scored) > 1 else 0.0,
            f"reward_errors/{name}": float(sum(r.error is not None for r in results)),
            f"reward_timeouts/{name}": float(sum(r.timed_out for r in results)),
        }
        if self.styles[k] == "trl":
            out[f"reward_none/{name}"] = float(sum(r.value is None and r.error is None for r in results))
        extras: dict[str, list[float]] = {}
        for r in results:
            for key, value in r.extras.items():
                extras.setdefault(key, []).append(value)
        seen = self._extra_keys[name]
        seen += [key for key in extras if key not in seen]
        out.update({f"reward/{name}/{key}": sum(extras.get(key, [0.0])) / max(len(extras.get(key, [])), 1)
                    for key in seen})
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


COUNTS = ("reward_errors/", "reward_timeouts/", "reward_none/")  # the scorer's keys that count calls


def pool_score_metrics(parts: Sequence[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """The scorer's metrics of several batches (generation rounds, processes) as one batch's: ``parts``
    holds (rows scored, metrics) per batch.

    A count (``reward_errors/``, ``reward_timeouts/``, ``reward_none/``) is the sum over the parts, as
    ``errored/*`` counts rows. ``reward/<name>`` is a mean over the calls with a verdict, so each part
    weighs by its verdicts, n_p - errors_p - none_p: sum_p mean_p * v_p / sum_p v_p (pooled_mean);
    ``reward/<name>_std`` is the std of all those verdicts (pooled_std). So the same rows give the same
    mean and std however processes and rounds split them: a run resumed on another number of processes
    logs the straight run's. Any other value (a verl-style extra) weighs by the part's rows.
    """
    keys = list(dict.fromkeys(key for _, m in parts for key in m))

    def verdicts(name: str, rows: int, m: Mapping[str, float]) -> float:
        return rows - m.get(f"reward_errors/{name}", 0.0) - m.get(f"reward_none/{name}", 0.0)

    def scored(key: str) -> str | None:
        """The reward whose verdicts ``key`` summarises (its mean or its std), or None."""
        name = key.removeprefix("reward/")
        for candidate in (name, name.removesuffix("_std")):
            if key.startswith("reward/") and f"reward_errors/{candidate}" in keys:
                return candidate
        return None

    out = {}
    for key in keys:
        name = scored(key)
        if key.startswith(COUNTS):
            out[key] = sum(m.get(key, 0.0) for _, m in parts)
        elif name is not None:  # its verdicts' mean or std
            stats = [(verdicts(name, rows, m), m.get(f"reward/{name}", 0.0), m.get(f"reward/{name}_std", 0.0))
                     for rows, m in parts]
            out[key] = pooled_std(stats) if key == f"reward/{name}_std" else pooled_mean(stats)
        else:
            total = sum(rows for rows, _ in parts)
            out[key] = sum(rows * m.get(key, 0.0) for rows, m in parts) / total if total else 0.0
    return out


def pooled_mean(parts: Sequence[tuple[float, float, float]]) -> float:
    """The mean of the union of several samples, from each one's (count n_p, mean m_p, std): sum_p n_p m_p /
    sum_p n_p, rounded to float32 as pooled_std is (0 when no part has a sample)."""
    parts = [p for p in parts if p[0] > 0]
    if len(parts) == 1:
        return _float32(parts[0][1])
    n = sum(count for count, _, _ in parts)
    return _float32(sum(count * m for count, m, _ in parts) / n) if n else 0.0


def pooled_std(parts: Sequence[tuple[float, float, float]]) -> float:
    """The sample std of the union of several samples, from each one's (count n_p, mean m_p, sample std s_p):
    with N = sum n_p and M = sum n_p m_p / N,

        s^2 = (sum_p (n_p - 1) s_p^2 + sum_p n_p (m_p - M)^2) / (N - 1)

    (Chan, Golub and LeVeque's pairwise update, all at once). A part with no sample adds nothing. The
    result is rounded to float32, as a lone part's std is: the parts' stds and means are float64
    (RewardScorer._metrics), so the rounding of float64's last bits, which depends on the split, is gone
    and one batch and the same rows in parts log the same number.
    """
    parts = [p for p in parts if p[0] > 0]
    n = sum(count for count, _, _ in parts)
    if len(parts) == 1:
        return _float32(parts[0][2])
    if n <= 1:
        return 0.0
    mean = sum(count * m for count, m, _ in parts) / n
    within = sum((count - 1) * s * s for count, _, s in parts)
    between = sum(count * (m - mean) ** 2 for count, m, _ in parts)
    return _float32(math.sqrt(max(within + between, 0.0) / (n - 1)))


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def combine_rewards(
    fns: Sequence[RewardFn], weights: Sequence[float] | None = None, **options: object
) -> RewardScorer:
    """Score completions with several rewards; the weighted total and each raw mean (see RewardScorer)."""
    return RewardScorer(fns, weights, **options)
