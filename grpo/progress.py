"""The console progress bar: step, ETA, raw reward, zero-variance groups."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StepProgress:
    """A rich progress bar over training steps, silent when disabled."""

    def __init__(self, total: int, *, enabled: bool = True, heldout: float | None = None) -> None:
        self.enabled = enabled
        self.heldout = heldout
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total, info="")

    def __enter__(self) -> StepProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if "heldout_accuracy" in metrics:
            self.heldout = metrics["heldout_accuracy"]
        info = f"reward {metrics['reward_mean']:.3f}  zero-var {metrics['zero_var_frac']:.2f}"
        if self.heldout is not None:
            info += f"  held-out {self.heldout:.1%}"
        self._progress.update(self._task, completed=step, info=info)
