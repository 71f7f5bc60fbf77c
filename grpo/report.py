"""`grpo report`: a run's curves as report.png and an HTML page with the plots, config, summary
and best/worst sample completions; for a run with tools or an environment also one whole episode
transcript and a tool-use table; for one run or two side by side, finished or still running.

Everything is read from the run directory: config.json, metrics.jsonl (one
record per step, plus the held-out evaluations at step 0 and at the end),
summary.json (absent while the run is in progress) and completions.jsonl.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo.alarms import ALARMS

# (panel title, metric keys, fixed y range or None): the curves the issue asks for, in reading order.
PANELS = (
    ("raw reward (mean over the batch)", ("reward_mean",), None),
    ("held-out accuracy", ("heldout_accuracy", "heldout_subset_accuracy", "heldout_pass@*", "heldout_maj@*"),
     (-0.02, 1.02)),
    ("fraction of zero-variance groups", ("zero_var_frac",), (-0.02, 1.02)),
    ("completion length (tokens)", ("completion_len", "completion_len_max"), None),
    ("KL to the reference", ("kl",), None),
    ("policy entropy (nats/token)", ("entropy",), None),
    ("generation wasted on zero-variance groups", ("generate_wasted_frac", "zero_var_tokens_frac"), (-0.02, 1.02)),
    ("screen calibration: share of groups that vary", ("screen_predicted_mixed", "screen_observed_mixed"),
     (-0.02, 1.02)),
)
LABELS = {"heldout_accuracy": "greedy pass@1", "heldout_subset_accuracy": "subset (alarms)", "reward_mean": "raw reward", "zero_var_frac": "zero-variance",
          "completion_len": "mean", "completion_len_max": "max", "kl": "kl", "entropy": "entropy",
          "generate_wasted_frac": "seconds (screening skipped included)", "zero_var_tokens_frac": "tokens",
          "screen_predicted_mixed": "predicted", "screen_observed_mixed": "observed"}
COLORS = ("tab:blue", "tab:orange")  # one per run, side by side
# The alarms' subset is a second greedy series on the held-out panel: a colour (per run) and marker of its own,
# so it is never mistaken for the full evaluation.
SUBSET_COLORS = ("tab:green", "tab:purple")
SAMPLES_SHOWN = 5


class ReportError(ValueError):
    """A run directory that cannot be reported on."""


@dataclass
class Run:
    """What a run directory holds; ``summary`` is None while the run is in progress."""

    path: Path
    config: dict
    records: list[dict]
    summary: dict | None
    completions: list[dict]

    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def last_step(self) -> int:
        steps = [r["step"] for r in self.records if "reward_mean" in r]
        return max(steps, default=0)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a metric, skipping records without it or with null (non-finite) values."""
        points = [(r["step"], r[key]) for r in self.records if r.get(key) is not None]
        return [s for s, _ in points], [v for _, v in points]

    def keys(self, pattern: str) -> list[str]:
        """Metric keys matching a key or a ``prefix*`` pattern, sorted by their k."""
        if not pattern.endswith("*"):
            return [pattern]
        found = {k for r in self.records for k in r if k.startswith(pattern[:-1])}
        return sorted(found, key=lambda k: (len(k), k))

    def alarms(self) -> dict[str, int]:
        """Each alarm that was on at some step, with the first such step."""
        first: dict[str, int] = {}
        for r in self.records:
            for name in ALARMS:
                if r.get(f"alarm/{name}"):
                    first.setdefault(name, r["step"])
        return first


def _read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a line cut short by a writer still at work is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not (path / "metrics.jsonl").exists():
        raise ReportError(f"{path} has no metrics.jsonl; is it a run directory?")
    config_file, summary_file = path / "config.json", path / "summary.json"
    return Run(
        path=path,
        config=json.loads(config_file.read_text()) if config_file.exists() else {},
        records=_read_jsonl(path / "metrics.jsonl"),
        summary=json.loads(summary_file.read_text()) if summary_file.exists() else None,
        completions=_read_jsonl(path / "completions.jsonl"),
    )


def status(run: Run) -> str:
    total = run.config.get("steps", "?")
    if run.summary is None:
        return f"in progress: step {run.last_step} of {total}"
    done = f"finished: {run.summary.get('steps', total)} steps in {run.summary.get('wall_seconds', 0):.0f} s"
    return done + (f"; stopped early: {run.summary['stopped_early']}" if run.summary.get("stopped_early") else "")


# ---- the PNG ----

def _line_style(key: str) -> dict:
    if key == "heldout_subset_accuracy":
        return {"linestyle": "-", "marker": "s", "markersize": 4}
    if "pass@" in key:
        return {"linestyle": "--", "marker": "^", "markersize": 4}
    if "maj@" in key:
        return {"linestyle": ":", "marker": "s", "markersize": 3}
    if key.endswith("_max"):
        return {"linestyle": "--", "alpha": 0.6}
    if key == "heldout_accuracy":  # drawn over the subset, which it equals where the subset is every prompt
        return {"linestyle": "-", "marker": "o", "markersize": 6, "zorder": 3}
    return {"linestyle": "-", "marker": None, "markersize": 4}


def _color(key: str, run_index: int) -> str:
    return (SUBSET_COLORS if key == "heldout_subset_accuracy" else COLORS)[run_index]


def scored_prompts(run: Run, key: str) -> int | None:
    """How many held-out prompts a greedy series scores: the full evaluation all of them (summary.json's
    heldout_size, else config.json's eval_size), the alarms' subset eval_subset - eval_train of them
    (all when eval_subset is 0), as grpo/heldout.py draws it. None where the config does not say."""
    config = run.config
    full = (run.summary or {}).get("heldout_size") or config.get("eval_size")
    if key == "heldout_accuracy" or not full:
        return full
    if key != "heldout_subset_accuracy" or "eval_subset" not in config:
        return None
    if not config["eval_subset"]:
        return full
    return min(max(config["eval_subset"] - config.get("eval_train", 0), 1), full)


def _label(key: str, run: Run, n_runs: int) -> str:
    label = LABELS.get(key) or key.removeprefix("heldout_")
    n = scored_prompts(run, key) if key in ("heldout_accuracy", "heldout_subset_accuracy") else None
    if n:
        label += f", {n} prompts"
    if "@" in key:
        label += f" ({run.config.get('eval_samples', '?')} samples)"
    return label if n_runs == 1 else f"{run.name}: {label}"


def plot(runs: Sequence[Run], out: Path) -> None:
    """The panels over the whole planned run, one colour per run, alarm steps shaded; a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(runs)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def figure(runs: Sequence[Run]):  # -> matplotlib.figure.Figure
    """The report's figure: panels, one colour per run (the held-out subset its own), alarm steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 4, figsize=(20, 8), constrained_layout=True)
    last = max([int(r.config.get("steps", 0)) for r in runs] + [r.last_step for r in runs] + [1])
    for ax, (title, patterns, ylim) in zip(axes.flat, PANELS, strict=True):
        for index, (color, run) in enumerate(zip(COLORS, runs, strict=False)):
            for key in (k for p in patterns for k in run.keys(p)):
                steps, values = run.series(key)
                if steps:
                    ax.plot(steps, values, color=_color(key, index), label=_label(key, run, len(runs)),
                            **_line_style(key))
            for step in _alarm_steps(run):
                ax.axvspan(step - 0.5, step + 0.5, color=color, alpha=0.12, linewidth=0)
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("step")
        ax.set_xlim(-0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ylim:
            ax.set_ylim(*ylim)
        elif patterns[0] == "reward_mean" and _within_unit(runs, "reward_mean"):
            ax.set_ylim(-0.02, 1.02)
        elif patterns[0] == "completion_len":
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(alpha=0.3)
        note = _panel_note(patterns[0], runs)
        if note:
            ax.text(0.5, 0.85, note, ha="center", va="center", transform=ax.transAxes, color="grey")
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    heading = "   vs   ".join(f"{r.name} ({status(r)})" for r in runs)
    fig.suptitle(f"{heading}\nshaded: steps with an alarm on", fontsize=11)
    return fig


def _within_unit(runs: Sequence[Run], key: str) -> bool:
    values = [v for r in runs for v in r.series(key)[1]]
    return bool(values) and 0.0 <= min(values) and max(values) <= 1.0


def _panel_note(key: str, runs: Sequence[Run]) -> str:
    if key == "kl" and all(r.config.get("beta", 1) == 0 for r in runs):
        return "beta = 0: no KL term, no reference model"
    if key == "screen_predicted_mixed" and not any(run.series(key)[0] for run in runs):
        return "no screening in this run (--screen K turns it on)"
    if not any(run.series(key)[0] for run in runs):
        return "no values yet" + (" (no policy update so far)" if key == "entropy" else "")
    return ""


def _alarm_steps(run: Run) -> list[int]:
    return sorted({r["step"] for r in run.records if any(r.get(f"alarm/{n}") for n in ALARMS)})


# ---- the HTML page ----

def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


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
    """Held-out scores and raw reward, first and latest; the alarms that went off."""
    sampled = {k for r in runs for p in ("heldout_pass@*", "heldout_maj@*") for k in r.keys(p)}
    keys = ["heldout_accuracy", *sorted(sampled, key=lambda k: ("maj@" in k, int(k.split("@")[1])))]
    rows = [["status", *(status(r) for r in runs)]]
    rows += [[_label(k, r, 1) if k != "heldout_accuracy" else "held-out greedy pass@1",
              *(_change(r, k, ".1%") for r in runs)] for k in keys for r in runs[:1]]
    rows.append(["raw reward", *(_change(r, "reward_mean", ".3f") for r in runs)])
    rows.append(["alarms (first step on)",
                 *(", ".join(f"{n} @ {s}" for n, s in r.alarms().items()) or "none" for r in runs)])
    rows.append(["alarm messages",
                 *(" | ".join((r.summary or {}).get("alarm_messages", {}).values()) or "-" for r in runs)])
    return _table(["", *(r.name for r in runs)], rows)


def config_table(runs: Sequence[Run]) -> str:
    keys = sorted({k for r in runs for k in r.config})
    rows = [[k, *(r.config.get(k, "-") for r in runs)] for k in keys]
    differs = {i for i, row in enumerate(rows) if len(runs) > 1 and len({json.dumps(v) for v in row[1:]}) > 1}
    return _table(["field", *(r.name for r in runs)], rows, differs)


def summary_table(run: Run) -> str:
    if run.summary is None:
        return f"<p>No summary.json yet ({html.escape(status(run))}); the latest step's metrics:</p>" + _table(
            ["metric", "value"], [[k, v] for r in run.records[-1:] for k, v in r.items()])
    return _table(["key", "value"], [[k, v] for k, v in run.summary.items()])


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


# per-step episode metrics (grpo/episodes.py episode_metrics), first and latest, for the tool-use table
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
body { font-family: DejaVu Sans, sans-serif; margin: 24px; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; white-space: pre-wrap; }
th { background: #f0f0f0; } tr.diff td { background: #fff3c4; }
img { max-width: 100%; border: 1px solid #ddd; }
.runs { display: flex; gap: 24px; flex-wrap: wrap; } .runs > div { flex: 1; min-width: 500px; }
"""


def page(runs: Sequence[Run], png: bytes) -> str:
    title = " vs ".join(r.name for r in runs)
    image = base64.b64encode(png).decode()
    per_run = "".join(
        f"<div><h3>{html.escape(r.name)}</h3><h4>summary</h4>{summary_table(r)}"
        f"{timing_section(r)}<h4>sample completions</h4>{sample_table(r)}{episode_section(r)}</div>"
        for r in runs
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>GRPO report: {html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>GRPO report: {html.escape(title)}</h1>"
        f"<h2>headline</h2>{headline(runs)}"
        f"<h2>curves</h2><img src='data:image/png;base64,{image}' alt='training curves'>"
        f"<h2>runs</h2><div class=runs>{per_run}</div>"
        f"<h2>config</h2>{config_table(runs)}</body></html>\n"
    )


def write_report(run_dirs: Sequence[str | Path], output: str | Path | None = None) -> tuple[Path, Path]:
    """Write the PNG and the page; return their paths. One run: report.png/html in its directory;
    two: report-vs-<B>.png/html in the first run's directory (or ``output``)."""
    if not 1 <= len(run_dirs) <= 2:
        raise ReportError(f"report takes one or two run directories, got {len(run_dirs)}")
    runs = [load_run(p) for p in run_dirs]
    out_dir = Path(output) if output else runs[0].path
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "report" if len(runs) == 1 else f"report-vs-{runs[1].name}"
    png, page_path = out_dir / f"{stem}.png", out_dir / f"{stem}.html"
    plot(runs, png)
    page_path.write_text(page(runs, png.read_bytes()), encoding="utf-8")
    return png, page_path
