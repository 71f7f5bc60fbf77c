"""The token limit fitted to the lengths a model writes (the pre-flight check's, grpo/run/preflight.py, for a
user's data with no limit given): 1.5 times what the completions that ended on their own, the correct ones, or
the gold answers need, never so low that it cuts the correct completions away; and the check's sampling, which
stops at that limit once most completions have ended."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

FIT_CUT = 0.1  # fit a lower limit only when at most this share hit the probe's
FIT_FLOOR = 48  # never below: a model that starts terse must still have room to learn to show its work
FIT_QUANTILE = 0.95  # the fitted limit is 1.5 x this quantile of the lengths of completions that ended ...
FIT_MIN_CORRECT = 5  # ... or, with at least this many correct completions, 1.5 x their median length if lower
KEEP_CORRECT = 0.9  # whatever else it follows, the fitted limit keeps at least this share of the correct completions


def fit_token_limit(lengths: Sequence[int], truncated: Sequence[bool], correct: Sequence[bool],
                    probe_limit: int, *, reach: Sequence[int | None] = (),
                    answer_lengths: Sequence[int] = ()) -> int | None:
    """The token limit a run on this data needs, rounded up to a multiple of 8, in [FIT_FLOOR, probe_limit];
    None when too many completions hit the probe's limit to tell and nothing says what an answer needs.

    1.5 x the 95th percentile of the lengths of completions that ended on their own; lower, 1.5 x the
    median length of the correct ones, when at least FIT_MIN_CORRECT were correct. A model asked for a
    short answer often explains at length instead: the answers that score need less room, and since the
    longest completion sets a batch's generation time, a run pays for the rambling on every step. On a
    file of "Compute 9 times 84. Answer with just the number." the 95th percentile was 165 tokens, the
    correct completions' median 41 (most of them 5 to 18 tokens, a few explanations up to 111).

    With fewer correct ones than that, the limit follows what a correct answer needs, not the ramblings:
    1.5 x the fewest tokens in which a completion reached the gold answer (``reach``: where the gold
    answer ends in each completion that contains it anywhere, None where it does not), or, when none
    did, 1.5 x the 95th percentile of the gold answers' own lengths (``answer_lengths``); never above
    the ramblings' fit. A cut completion scores 0 and is counted, which teaches the policy to answer
    within the limit. Whichever rule applies, the limit keeps KEEP_CORRECT of the correct completions
    (``correct_floor``).
    """
    natural = sorted(n for n, cut in zip(lengths, truncated, strict=True) if not cut)
    fitted = None
    if natural and 1 - len(natural) / len(lengths) <= FIT_CUT:
        p95 = natural[min(len(natural) - 1, math.ceil(FIT_QUANTILE * len(natural)) - 1)]
        solved = sorted(n for n, ok, cut in zip(lengths, correct, truncated, strict=True) if ok and not cut)
        median = solved[(len(solved) - 1) // 2] if solved else p95
        fitted = _rounded_limit(min(p95, median) if len(solved) >= FIT_MIN_CORRECT else p95, probe_limit)
    if sum(correct) < FIT_MIN_CORRECT:
        reached = [r for r in reach if r]
        gold = sorted(answer_lengths)
        if reached or gold:
            need = min(reached) if reached else gold[min(len(gold) - 1, math.ceil(FIT_QUANTILE * len(gold)) - 1)]
            fitted = min(_rounded_limit(need, probe_limit), fitted or probe_limit)
    keep = correct_floor(lengths, truncated, correct, probe_limit)
    return fitted if fitted is None or keep is None else max(fitted, keep)


def correct_floor(lengths: Sequence[int], truncated: Sequence[bool], correct: Sequence[bool],
                  probe_limit: int) -> int | None:
    """The lowest multiple of 8 (at most probe_limit) that keeps KEEP_CORRECT of the correct completions
    that ended on their own: their ceil(0.9 n)-th shortest length, rounded up; None with none correct.

    The fits above follow the typical completion, and a policy that explains before it answers writes
    correct completions longer than that: on a file of two-digit subtractions the limit fitted to 48
    tokens cut 21% of the check's completions, correct ones among them, and the pass rate fell from 7.8%
    to 3.1%. The correct completions are what GRPO learns from; a limit must not cut them away."""
    solved = sorted(n for n, ok, cut in zip(lengths, correct, truncated, strict=True) if ok and not cut)
    if not solved:
        return None
    need = solved[math.ceil(KEEP_CORRECT * len(solved)) - 1]
    return int(min(probe_limit, 8 * math.ceil(need / 8)))


def _rounded_limit(tokens: float, probe_limit: int) -> int:
    """1.5 x tokens, rounded up to a multiple of 8, in [FIT_FLOOR, probe_limit]."""
    return int(min(probe_limit, max(FIT_FLOOR, 8 * math.ceil(1.5 * tokens / 8))))


def stop_at_fitted_limit(rows: int, probe_limit: int) -> Callable[[int, int], bool]:
    """For ``generate``: once 95% of the rows have ended (at t tokens), stop at the limit that the fit will
    choose, 1.5 t: the rows still running would be cut there in training too, so they need not run on."""
    ended_at: list[int] = []

    def stop(tokens: int, running: int) -> bool:
        if not ended_at and running <= (1 - FIT_QUANTILE) * rows:
            ended_at.append(tokens)
        return bool(ended_at) and tokens >= _rounded_limit(ended_at[0], probe_limit)

    return stop


def mean_tokens(lengths: Sequence[int], limit: int) -> float:
    """The mean completion length at a token limit of ``limit`` (0.0 without lengths)."""
    return sum(min(n, limit) for n in lengths) / len(lengths) if lengths else 0.0
