"""The page's charts, drawn by Bokeh: the PNG's panels and one of any logged metric, every run on one axis
(one colour per run, a dash per series), hover for a point's step and value, zoom shared by every chart
(their step axis is one range), a click on a legend entry hides its series, alarm steps shaded and the
alarms named at their first step.

Bokeh because its JavaScript (BokehJS, 1.3 MB) ships inside its PyPI wheel and is inlined here, so the page
opens offline and nothing comes from npm or a CDN; docs/report.md says more.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from grpo.observe.alarms import ALARMS
from grpo.observe.report.run import (
    PANELS,
    Run,
    alarm_steps,
    label,
    marker,
    panel_note,
    run_color,
    series_dash,
    within_unit,
)

WIDTH, HEIGHT = 300, 190  # of the plotting area: a legend below adds to it, never takes from it
TOOLS = "pan,box_zoom,wheel_zoom,reset,save"
TOOLTIPS = [("", "@run: @series"), ("step", "@x"), ("value", "@y{0.[0000]}")]
ANY_METRIC = "any-metric"  # the name of the chart of any one metric, which page.js fills from METRICS_ID's JSON
METRICS_ID = "grpo-metrics"


def _source(run: Run, key: str, n_runs: int):  # -> ColumnDataSource
    from bokeh.models import ColumnDataSource

    steps, values = run.series(key)
    name = label(key, run, 1)
    return ColumnDataSource({"x": steps, "y": values, "run": [run.name] * len(steps), "series": [name] * len(steps)},
                            name=f"{run.name}: {name}" if n_runs > 1 else name)


def _series(fig, source, color: str, dash: str, shape: str | None, name: str) -> list:
    """A line and its points (the held-out ones marked, the per-step ones invisible but hoverable)."""
    line = fig.line("x", "y", source=source, color=color, line_dash=dash, line_width=2, name=name)
    dots = fig.scatter("x", "y", source=source, marker=shape or "circle", size=7 if shape else 8, color=color,
                       alpha=1.0 if shape else 0.0, hover_alpha=1.0, name=f"{name} (points)")
    return [line, dots]


def _alarm_marks(fig, run: Run, color: str) -> None:
    """Each stretch of steps with an alarm on, shaded in the run's colour; each alarm named at its first step."""
    from bokeh.models import BoxAnnotation, Label, Span

    steps = alarm_steps(run)
    starts = [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s - 1]
    ends = [s for i, s in enumerate(steps) if i == len(steps) - 1 or steps[i + 1] != s + 1]
    for start, end in zip(starts, ends, strict=True):
        fig.add_layout(BoxAnnotation(left=start - 0.5, right=end + 0.5, fill_color=color, fill_alpha=0.12,
                                     line_alpha=0))
    for name, step in run.alarms().items():
        fig.add_layout(Span(location=step, dimension="height", line_color=color, line_dash="dotted"))
        fig.add_layout(Label(x=step, y=4, y_units="screen", text=f" alarm: {name}", angle=90, angle_units="deg",
                             text_font_size="10px", text_color=color))


def panel(title: str, patterns: Sequence[str], ylim: tuple[float, float] | None, runs: Sequence[Run], x_range):
    """One of PANELS: every run's series of it, a legend below whose entries hide their series on a click."""
    from bokeh.models import HoverTool, Legend, LegendItem, Range1d, Title
    from bokeh.plotting import figure

    fig = figure(title=title, frame_width=WIDTH, frame_height=HEIGHT, x_range=x_range, tools=TOOLS, name=title,
                 x_axis_label="step")
    if ylim or (patterns[0] == "reward_mean" and within_unit(runs, "reward_mean")):
        fig.y_range = Range1d(*(ylim or (-0.02, 1.02)))
    items, hoverable = [], []
    for index, run in enumerate(runs):
        for n, key in enumerate(run.panel_keys(patterns)):
            source = _source(run, key, len(runs))
            drawn = _series(fig, source, run_color(index), series_dash(n), marker(key), source.name)
            items.append(LegendItem(label=source.name, renderers=drawn))
            hoverable.append(drawn[1])
        _alarm_marks(fig, run, run_color(index))
    fig.add_tools(HoverTool(renderers=hoverable, tooltips=TOOLTIPS))
    if items:
        fig.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="10px", spacing=0,
                              padding=2, margin=2, ncols=1 if len(items) < 4 else 2), "below")
    note = panel_note(patterns[0], runs)
    if note:
        fig.add_layout(Title(text=note, text_color="grey", text_font_style="italic"), "above")
    return fig


def metric_keys(runs: Sequence[Run]) -> list[str]:
    """Every numeric metric any run logged (the alarms' 0/1 flags left to the shading)."""
    found = {k for r in runs for rec in r.records for k, v in rec.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(found - {"step"} - {f"alarm/{name}" for name in ALARMS})


def any_metric(runs: Sequence[Run], x_range):
    """A chart of the metric chosen in the page's list: one source per run, filled by page.js."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    fig = figure(title="any metric (chosen above)", frame_width=2 * WIDTH, frame_height=HEIGHT, x_range=x_range,
                 tools=TOOLS, name=ANY_METRIC, x_axis_label="step")
    hoverable = []
    for index, run in enumerate(runs):  # the raw reward to begin with, which page.js replaces on a choice
        steps, values = run.series("reward_mean")
        source = ColumnDataSource({"x": steps, "y": values, "run": [run.name] * len(steps),
                                   "series": ["reward_mean"] * len(steps)}, name=f"{ANY_METRIC}-{index}")
        hoverable.append(_series(fig, source, run_color(index), series_dash(0), None, run.name)[1])
        _alarm_marks(fig, run, run_color(index))
    fig.add_tools(HoverTool(renderers=hoverable, tooltips=TOOLTIPS))
    return fig


def metrics_json(runs: Sequence[Run]) -> str:
    """{metric: [[steps, values] per run]} for the chart of any metric, safe inside a <script> element."""
    data = {key: [list(run.series(key)) for run in runs] for key in metric_keys(runs)}
    return json.dumps({"runs": [r.name for r in runs], "metrics": data}).replace("</", "<\\/")


def charts(runs: Sequence[Run]) -> tuple[str, str, str, str]:
    """(BokehJS inline, the charts' script, the panels' element, the element of the chart of any metric)."""
    from bokeh.core.validation import silence
    from bokeh.core.validation.warnings import MISSING_RENDERERS
    from bokeh.embed import components
    from bokeh.layouts import gridplot
    from bokeh.models import Range1d
    from bokeh.resources import Resources

    silence(MISSING_RENDERERS, True)  # a panel with nothing logged yet is expected, and says so in a note
    last = max([int(r.config.get("steps", 0)) for r in runs] + [r.last_step for r in runs] + [1])
    x_range = Range1d(-0.5, last + 0.5)  # one range: zooming one chart's steps zooms all of them
    panels = [panel(title, patterns, ylim, runs, x_range) for title, patterns, ylim in PANELS]
    script, (grid, chosen) = components((gridplot(panels, ncols=4, toolbar_location="right"),
                                         any_metric(runs, x_range)))
    return Resources(mode="inline", components=["bokeh"]).render_js(), script, grid, chosen
