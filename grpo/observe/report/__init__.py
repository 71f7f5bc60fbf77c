"""`grpo report`: a run's curves as report.png (png.py) and an interactive HTML page (page.py: the charts
of charts.py, the groups of the sampled steps, headline, phases, config, best and worst completions; for a
run with tools or an environment one whole episode and a tool-use table); for one run or several on one axis,
finished or still running. run.py reads a run directory and holds what the PNG and the page share.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo.observe.report.page import page
from grpo.observe.report.png import figure, plot
from grpo.observe.report.run import PANELS, ReportError, Run, load_run

__all__ = ["PANELS", "ReportError", "Run", "figure", "load_run", "plot", "write_report"]


def write_report(run_dirs: Sequence[str | Path], output: str | Path | None = None) -> tuple[Path, Path]:
    """Write the PNG and the page; return their paths. One run: report.png/html in its directory; more:
    report-vs-<B>[-vs-<C>...].png/html in the first run's directory (or ``output``)."""
    if not run_dirs:
        raise ReportError("report takes one or more run directories, got none")
    runs = [load_run(p) for p in run_dirs]
    out_dir = Path(output) if output else runs[0].path
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "-vs-".join(["report", *(r.name for r in runs[1:])])
    png, page_path = out_dir / f"{stem}.png", out_dir / f"{stem}.html"
    plot(runs, png)
    page_path.write_text(page(runs), encoding="utf-8")
    return png, page_path
