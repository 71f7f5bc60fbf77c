"""The console: progress bars with ETA for training and evaluation, a one-line summary every
few steps, and alarm warnings.

The bars are rich's, imported only when they are shown: without rich (a GPU
machine with torch and transformers alone) the trainer prints plain lines.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _fmt(metrics: dict, key: str, spec: str) -> str:
    value = metrics.get(key)
    return "-" if value is None or value != value else format(value, spec)  # None or NaN


def summary_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """A compact one-line view of a step's metrics for the console."""
    m = metrics
    parts = [
        f"step {step}/{total}",
        f"reward {_fmt(m, 'reward_mean', '.3f')}±{_fmt(m, 'reward_std', '.2f')}",
        f"acc {_fmt(m, 'accuracy', '.0%')}",
        f"zero-var {_fmt(m, 'zero_var_frac', '.2f')}",
        f"len {_fmt(m, 'completion_len', '.1f')} (max {_fmt(m, 'completion_len_max', '.0f')}, "
        f"trunc {_fmt(m, 'truncated_frac', '.0%')})",
        f"rep {_fmt(m, 'repeat_ngram_frac', '.2f')}",
        f"kl {_fmt(m, 'kl', '.4f')}",
        f"entropy {_fmt(m, 'entropy', '.3f')}",
        f"clip {_fmt(m, 'clip_frac_low', '.3f')}/{_fmt(m, 'clip_frac_high', '.3f')}",
        f"grad {_fmt(m, 'grad_norm', '.2f')}",
        f"{_fmt(m, 'tokens_per_second', '.0f')} tok/s",
        f"{_fmt(m, 'time_step', '.1f')} s",
    ]
    if "teacher_kl" in m:  # on-policy distillation (grpo/learning/teacher/)
        parts.insert(7, f"teacher_kl {m['teacher_kl']:.4f} (disagree {_fmt(m, 'teacher_disagree_frac', '.2f')})")
    if "heldout_accuracy" in m:
        parts.append(f"held-out {m['heldout_accuracy']:.1%}")
    elif "heldout_subset_accuracy" in m:
        parts.append(f"held-out subset {m['heldout_subset_accuracy']:.1%}")
    return "  ".join(parts)


ERRORED_SHOWN = 0.05  # a step whose errored rows pass this share of its batch says so on the console


def errored_line(step: int, metrics: dict[str, float]) -> str | None:
    """The console line of a step where more than ERRORED_SHOWN of the rows errored (None otherwise)."""
    share = metrics.get("errored_frac", 0.0)
    if not share > ERRORED_SHOWN:
        return None
    causes = {k.split("/", 1)[1]: int(v) for k, v in metrics.items() if k.startswith("errored/") and v}
    said = ", ".join(f"{n} {cause}" for cause, n in causes.items())
    return (f"step {step}: {share:.0%} of the rows errored ({said}; reward: a reward call failed or timed out, "
            "environment: it raised, truncated: cut at the token limit under --mask-truncated) and were left "
            "out of the loss and of their groups' statistics (errored/* in metrics.jsonl)")


def _bars(stderr: bool = False) -> object | None:
    """rich's Progress with the trainer's columns (on stderr when ``stderr``), or None when rich is not
    installed."""
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
    except ImportError:
        return None
    from rich.console import Console

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=Console(stderr=True) if stderr else None,
    )


@contextmanager
def eval_progress(total: int, said: str | None) -> Iterator[Callable[[int], None]]:
    """`grpo eval`'s line ``said`` and its bar over its ``total`` completions, on stderr (stdout holds the
    result alone: pure JSON with --json); yields the callback that advances the bar. ``said`` None
    (--no-progress): neither; without rich: the line alone."""
    if said is not None:
        print(said, file=sys.stderr, flush=True)
    bars = _bars(stderr=True) if said is not None else None
    if bars is None:
        yield lambda n: None
        return
    with bars:
        task = bars.add_task("eval", total=total, info="held-out")
        yield lambda n: bars.advance(task, n)


class StepProgress:
    """Rich progress bars over training steps and evaluation prompts; plain prints when disabled (or
    when rich is not installed)."""

    def __init__(self, total: int, *, enabled: bool = True, silent: bool = False) -> None:
        self.silent = silent  # prints nothing (a process other than rank 0)
        self.heldout: float | None = None
        self._progress = _bars() if enabled else None
        self.enabled = self._progress is not None
        if self._progress is not None:
            self._task = self._progress.add_task("train", total=total, info="")

    def __enter__(self) -> StepProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        latest = metrics.get("heldout_accuracy", metrics.get("heldout_subset_accuracy"))
        if latest is not None:
            self.heldout = latest
        info = f"reward {metrics['reward_mean']:.3f}  zero-var {metrics['zero_var_frac']:.2f}"
        if self.heldout is not None:
            info += f"  held-out {self.heldout:.1%}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)

    @contextmanager
    def evaluating(self, total: int) -> Iterator[Callable[[int], None]]:
        """A bar over the evaluation's prompts while it runs; yields the callback that advances it."""
        if self._progress is None:
            yield lambda n: None
            return
        task = self._progress.add_task("eval", total=total, info="held-out")
        try:
            yield lambda n: self._progress.advance(task, n)
        finally:
            self._progress.remove_task(task)

    def print(self, text: str) -> None:
        """A line above the bars (or a plain print when they are off)."""
        if self.silent:
            return
        if self._progress is not None:
            from rich.markup import escape

            self._progress.console.print(escape(text), highlight=False)
        else:
            print(text, flush=True)

    def warn(self, step: int, text: str, *, kind: str = "warning") -> None:
        """An alarm's line in yellow; ``kind="note"``: a note's (no alarm), unstyled."""
        line = f"{kind} (step {step}): {text}"
        if self.silent:
            return
        if self._progress is not None:
            from rich.markup import escape

            style = "bold yellow" if kind == "warning" else "default"
            self._progress.console.print(f"[{style}]{escape(line)}[/]", highlight=False)
        else:
            print(line, flush=True)
