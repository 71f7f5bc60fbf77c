"""The report's HTML page: one file that opens offline (BokehJS, the data and page.js inline). The headline
(status, held-out first to latest, alarms), the charts (charts.py), the groups of the sampled steps
(groups.py), each run's summary, seconds per phase, best and worst completions and tool use, and the config as
a table of values.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo.observe.report.charts import METRICS_ID, charts, metric_keys, metrics_json
from grpo.observe.report.groups import groups_section
from grpo.observe.report.run import SAMPLES_SHOWN, Run, label, status

SCRIPT = Path(__file__).with_name("page.js")


def flatten(values: Mapping, prefix: str = "") -> dict[str, object]:
    """A nested mapping as dotted keys to single values (a list of plain values joined by commas), so that
    a table shows values, not JSON."""
    out: dict[str, object] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}.") if value else {name: "-"})
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in value):
            out.update(flatten({str(i): v for i, v in enumerate(value)}, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = ", ".join(_fmt(v) for v in value) if value else "-"
        else:
            out[name] = value
    return out


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], marked: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        f"<tr{' class=diff' if i in marked else ''}>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _change(run: Run, key: str, spec: str) -> str:
    """First and latest value of a metric, with their steps."""
    steps, values = run.series(key)
    if not values:
        return "-"
    return f"{values[0]:{spec}} (step {steps[0]}) → {values[-1]:{spec}} (step {steps[-1]})"


def headline(runs: Sequence[Run]) -> str:
    """Held-out scores and raw reward, first and latest; the alarms that went off; the notes, apart."""
    sampled = {k for r in runs for p in ("heldout_pass@*", "heldout_maj@*") for k in r.keys(p)}
    keys = ["heldout_accuracy", *sorted(sampled, key=lambda k: ("maj@" in k, int(k.split("@")[1])))]
    rows = [["status", *(status(r) for r in runs)]]
    rows += [[label(k, r, 1) if k != "heldout_accuracy" else "held-out greedy pass@1",
              *(_change(r, k, ".1%") for r in runs)] for k in keys for r in runs[:1]]
    rows.append(["raw reward", *(_change(r, "reward_mean", ".3f") for r in runs)])
    rows.append(["alarms (first step on)",
                 *(", ".join(f"{n} @ {s}" for n, s in r.alarms().items()) or "none" for r in runs)])
    rows.append(["alarm messages",
                 *(" | ".join((r.summary or {}).get("alarm_messages", {}).values()) or "-" for r in runs)])
    rows.append(["notes (no alarm)",  # slow progress: said, never a stop (docs/alarms.md)
                 *(" | ".join((r.summary or {}).get("notes", {}).values()) or "-" for r in runs)])
    return _table(["", *(r.name for r in runs)], rows)


def config_table(runs: Sequence[Run]) -> str:
    """Every field of each run's config.json, one value a cell (nested ones flattened); a row whose values
    differ between the runs marked."""
    configs = [flatten(r.config) for r in runs]
    keys = sorted({k for c in configs for k in c})
    rows = [[k, *(c.get(k, "-") for c in configs)] for k in keys]
    differs = {i for i, row in enumerate(rows) if len(runs) > 1 and len({_fmt(v) for v in row[1:]}) > 1}
    return _table(["field", *(r.name for r in runs)], rows, differs)


def summary_table(run: Run) -> str:
    if run.summary is None:
        return f"<p>No summary.json yet ({html.escape(status(run))}); the latest step's metrics:</p>" + _table(
            ["metric", "value"], [[k, v] for r in run.records[-1:] for k, v in r.items()])
    return _table(["key", "value"], list(flatten(run.summary).items()))


def sample_table(run: Run) -> str:
    """The best and worst completions by reward from the latest step that wrote samples."""
    if not run.completions:
        return "<p>No completions.jsonl yet (samples are written every sample_every steps).</p>"
    step = max(c["step"] for c in run.completions)
    latest = sorted((c for c in run.completions if c["step"] == step), key=lambda c: -c["reward"])
    parts = [f"<p>Step {step}: {len(latest)} completions, mean reward "
             f"{sum(c['reward'] for c in latest) / len(latest):.3f}.</p>"]
    if latest[0]["reward"] == latest[-1]["reward"]:
        shown = [("all scored the same; a sample", latest[:: max(1, len(latest) // SAMPLES_SHOWN)][:SAMPLES_SHOWN])]
    else:
        shown = [("best", latest[:SAMPLES_SHOWN]), ("worst", latest[-SAMPLES_SHOWN:][::-1])]
    for title, rows in shown:
        cells = [[c["reward"], c.get("advantage", "-"), c["prompt"], c.get("answer", ""), c["completion"]] for c in rows]
        parts.append(f"<h4>{title}</h4>" + _table(["reward", "advantage", "prompt", "answer", "completion"], cells))
    return "".join(parts)


# per-step episode metrics (grpo/sampling/episode_scores.py episode_metrics), first and latest, for the tool-use table
EPISODE_KEYS = (("turns_per_episode", ".2f"), ("tool_calls_per_episode", ".2f"), ("parse_failures", ".0f"),
                ("tool_errors", ".0f"), ("tool_timeouts", ".0f"), ("env_errors", ".0f"),
                ("seconds_tools", ".1f"), ("seconds_env", ".1f"), ("env_token_frac", ".1%"))


def episode_section(run: Run) -> str:
    """For a run with tools or an environment: how tool use went, first step to latest, and the best
    episode of the latest sampled step as a role-tagged transcript; empty for a single-turn run."""
    rows = [[key, _change(run, key, spec)] for key, spec in EPISODE_KEYS if run.series(key)[0]]
    episodes = [c for c in run.completions if c.get("transcript")]
    if not rows and not episodes:
        return ""
    parts = ["<h4>tool use (first step → latest)</h4>" + _table(["metric", "value"], rows)] if rows else []
    if episodes:
        step = max(c["step"] for c in episodes)
        best = max((c for c in episodes if c["step"] == step), key=lambda c: c["reward"])
        turns = [[m.get("role", "?"), m.get("content", "")] for m in best["transcript"]]
        parts.append(f"<h4>an episode (step {step}, reward {best['reward']:.3g}, the best of its step)</h4>"
                     + _table(["role", "content"], turns))
    return "".join(parts)


# where a step's seconds went, mean over the steps: the phases, and with --async-lag the waits on each side
TIME_KEYS = ("time_generate", "time_reward", "time_update", "time_sync", "time_wait_sampler", "time_wait_trainer",
             "time_step")


def timing_section(run: Run) -> str:
    """Mean seconds per step of each phase (generation and scoring happen in a thread when sampling ahead:
    then time_wait_sampler is what the trainer waited for a batch, time_wait_trainer the thread for weights)."""
    rows = []
    for key in TIME_KEYS:
        _, values = run.series(key)
        if values:
            rows.append([key, f"{sum(values) / len(values):.2f}"])
    _, lags = run.series("async_lag")
    if lags:  # not seconds: how many updates old the batches were (K once the first K + 1 are trained)
        rows.append(["async_lag (updates)", f"{sum(lags) / len(lags):.2f}"])
    return "<h4>seconds per step (mean)</h4>" + _table(["phase", "mean"], rows) if rows else ""


STYLE = """
body { font-family: DejaVu Sans, sans-serif; margin: 24px; color: #222; max-width: 1600px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; white-space: pre-wrap; }
th { background: #f0f0f0; } tr.diff td { background: #fff3c4; }
#charts { padding-bottom: 28px; }
.runs { display: flex; gap: 24px; flex-wrap: wrap; } .runs > div { flex: 1; min-width: 500px; }
#groups tr.odd td { background: #f6f8fb; } #groups th[data-key] { cursor: pointer; text-decoration: underline dotted; }
#groups td.text { max-width: 520px; } .filters label { margin-right: 14px; font-size: 13px; } .filters input { width: 6em; }
"""


def page(runs: Sequence[Run]) -> str:
    title = html.escape(" vs ".join(r.name for r in runs))
    bokeh_js, chart_script, panels, chosen = charts(runs)
    options = "".join(f"<option{' selected' if k == 'reward_mean' else ''}>{html.escape(k)}</option>"
                      for k in metric_keys(runs))
    per_run = "".join(
        f"<div><h3>{html.escape(r.name)}</h3><h4>summary</h4>{summary_table(r)}"
        f"{timing_section(r)}<h4>sample completions</h4>{sample_table(r)}{episode_section(r)}</div>"
        for r in runs
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>GRPO report: {title}</title>"
        f"<style>{STYLE}</style>{bokeh_js}</head><body><h1>GRPO report: {title}</h1>"
        f"<h2>headline</h2>{headline(runs)}"
        "<h2>curves</h2><p>Hover a point for its step and value; zoom with the toolbar's box or wheel zoom "
        "(every chart's steps together); a click on a legend entry hides its series; shaded: steps with an "
        "alarm on.</p>"
        f"<div id=charts>{panels}</div><p><label>any metric: <select id=metric>{options}</select></label></p>{chosen}"
        f"<h2>groups</h2>{groups_section(runs)}"
        f"<h2>runs</h2><div class=runs>{per_run}</div>"
        f"<h2>config</h2>{config_table(runs)}"
        f"<script type='application/json' id={METRICS_ID}>{metrics_json(runs)}</script>"
        f"{chart_script}<script>{SCRIPT.read_text(encoding='utf-8')}</script></body></html>\n"
    )
