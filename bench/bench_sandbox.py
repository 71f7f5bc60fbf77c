"""What isolation costs: score 64 code completions (3 tests each) as training does, and the sandbox's overhead.

Prints
- seconds to score all 64 through the trainer's reward path (``code_tests`` in ``--workers``
  reward processes), in strict mode (bubblewrap);
- the median, over the 64, of one completion's wall time in strict mode minus the same
  completion's run with no sandbox at all (mode "none": same harness, same verdicts), one at a
  time, the modes taking turns; and the same for weak mode.

The completions are the built-in ``code`` task's reference solutions, each row cut to its first
three asserts; every other one is broken (returns None), so half score 1 and half 0.

    .venv/bin/python bench/bench_sandbox.py            # the issue's figure: 64 completions, 2 workers
"""

from __future__ import annotations

import argparse
import statistics
import time

from grpo.rewards.code import code_tests, evaluate, extract_code, row_tests
from grpo.rewards.combine import RewardScorer
from grpo.rewards.sandbox import check_sandbox
from grpo.tasks import get_task


def workload(n: int) -> tuple[list[str], list[dict]]:
    """n (completion, row) pairs: rows with 3 asserts, every other completion broken."""
    task = get_task("code")
    rows = [*task.train, *task.heldout][:n]
    rows = [{**row, "tests": "\n".join(row["tests"].splitlines()[:3])} for row in rows]
    texts = []
    for i, row in enumerate(rows):
        code = row["solution"] if i % 2 == 0 else row["solution"].replace("return ", "return None and ")
        texts.append(f"```python\n{code}```")
    return texts, rows


def score_all(texts: list[str], rows: list[dict], workers: int) -> tuple[float, float]:
    """(seconds, mean reward) of scoring every completion through the reward workers."""
    scorer = RewardScorer([code_tests], workers=workers, timeout=30.0)
    try:
        start = time.perf_counter()
        rewards, _ = scorer(texts, rows)
        return time.perf_counter() - start, rewards.nan_to_num(0.0).mean().item()  # a failed call: 0
    finally:
        scorer.close()


def one_at_a_time(texts: list[str], rows: list[dict], modes: tuple[str, ...]) -> dict[str, list[float]]:
    """Seconds per completion in each mode, the modes taking turns on each completion (so that load
    from elsewhere on the machine falls on all of them alike)."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for text, row in zip(texts, rows, strict=True):
        for mode in modes:
            start = time.perf_counter()
            evaluate(extract_code(text), row_tests(row), mode=mode)
            times[mode].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="reward worker processes (the trainer's default: 2)")
    args = parser.parse_args()
    check_sandbox("strict")
    texts, rows = workload(args.completions)
    seconds, mean = score_all(texts, rows, args.workers)
    print(f"{len(texts)} completions x 3 tests, strict sandbox, {args.workers} reward workers: "
          f"{seconds:.2f} s to score all (mean reward {mean:.2f})")
    times = one_at_a_time(texts, rows, ("none", "strict", "weak"))
    bare = times["none"]
    for mode in ("strict", "weak"):
        sandboxed = times[mode]
        overhead = statistics.median(s - b for s, b in zip(sandboxed, bare, strict=True))
        print(f"{mode}: median per-completion time {statistics.median(sandboxed) * 1000:.0f} ms, "
              f"unsandboxed {statistics.median(bare) * 1000:.0f} ms, median overhead {overhead * 1000:.0f} ms")


if __name__ == "__main__":
    main()
