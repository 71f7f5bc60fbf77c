"""report.png: the panels of grpo/observe/report/run.py PANELS drawn by matplotlib, for papers and terminals."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo.observe.report.run import (
    PANELS,
    Run,
    alarm_steps,
    label,
    marker,
    panel_note,
    run_color,
    series_dash,
    status,
    within_unit,
)

MPL_DASHES = {"solid": "-", "dashed": "--", "dotted": ":", "dashdot": "-.", "dotdash": (0, (6, 2, 1, 2, 1, 2))}
MPL_MARKERS = {"square": "s", "triangle": "^", "diamond": "D", "circle": "o", None: None}


def _line_style(key: str, series_index: int) -> dict:
    style = {"linestyle": MPL_DASHES[series_dash(series_index)], "marker": MPL_MARKERS[marker(key)],
             "markersize": 4}
    if key == "heldout_accuracy":  # drawn over the subset, which it equals where the subset is every prompt
        style.update(markersize=6, zorder=3)
    return style


def shade(color: str, series_index: int) -> str:
    """A run's colour for its first series of a panel, darker for each next one: one hue per run (scaling
    red, green and blue alike keeps the hue) and no two series of a panel in one colour, in print as well."""
    from matplotlib.colors import to_hex, to_rgb

    return to_hex(tuple(channel * 0.6 ** series_index for channel in to_rgb(color)))


def plot(runs: Sequence[Run], out: Path) -> None:
    """The panels over the whole planned run, one hue per run, a shade and a dash per series, alarm steps shaded; a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(runs)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def figure(runs: Sequence[Run]):  # -> matplotlib.figure.Figure
    """The report's figure: panels, one hue per run, a shade and a dash per series of a run, alarm steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 4, figsize=(20, 8), constrained_layout=True)
    last = max([int(r.config.get("steps", 0)) for r in runs] + [r.last_step for r in runs] + [1])
    for ax, (title, patterns, ylim) in zip(axes.flat, PANELS, strict=True):
        for index, run in enumerate(runs):
            for n, key in enumerate(run.panel_keys(patterns)):
                ax.plot(*run.series(key), color=shade(run_color(index), n), label=label(key, run, len(runs)),
                        **_line_style(key, n))
            for step in alarm_steps(run):
                ax.axvspan(step - 0.5, step + 0.5, color=run_color(index), alpha=0.12, linewidth=0)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("step")
        ax.set_xlim(-0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ylim:
            ax.set_ylim(*ylim)
        elif patterns[0] == "reward_mean" and within_unit(runs, "reward_mean"):
            ax.set_ylim(-0.02, 1.02)
        elif patterns[0] == "completion_len":
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(alpha=0.3)
        note = panel_note(patterns[0], runs)
        if note:
            ax.text(0.5, 0.85, note, ha="center", va="center", transform=ax.transAxes, color="grey")
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    heading = "   vs   ".join(f"{r.name} ({status(r)})" for r in runs)
    fig.suptitle(f"{heading}\nshaded: steps with an alarm on", fontsize=11)
    return fig
