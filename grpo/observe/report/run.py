"""A run directory as the report reads it, and what its PNG and its page share: the panels, one colour per
run, a dash per series, labels and notes.

Everything is read from the run directory: config.json, metrics.jsonl (one
record per step, plus the held-out evaluations at step 0 and at the end),
summary.json (absent while the run is in progress) and completions.jsonl.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo.observe.alarms import ALARMS

# (panel title, metric keys, fixed y range or None): the curves the issue asks for, in reading order.
PANELS = (
    ("raw reward (mean over the batch)", ("reward_mean",), None),
    ("held-out accuracy", ("heldout_accuracy", "heldout_subset_accuracy", "heldout_pass@*", "heldout_maj@*"),
     (-0.02, 1.02)),
    ("fraction of zero-variance groups", ("zero_var_frac",), (-0.02, 1.02)),
    ("completion length (tokens)", ("completion_len", "completion_len_max"), None),
    ("KL to the reference and to the teacher", ("kl", "teacher_kl"), None),  # teacher_kl: grpo/learning/teacher/
    ("policy entropy (nats/token)", ("entropy",), None),
    ("generation wasted on zero-variance groups", ("generate_wasted_frac", "zero_var_tokens_frac"), (-0.02, 1.02)),
    ("screen calibration: share of groups that vary", ("screen_predicted_mixed", "screen_observed_mixed"),
     (-0.02, 1.02)),
)
LABELS = {"heldout_accuracy": "greedy pass@1", "heldout_subset_accuracy": "subset (alarms)", "reward_mean": "raw reward", "zero_var_frac": "zero-variance",
          "completion_len": "mean", "completion_len_max": "max", "kl": "kl", "teacher_kl": "teacher_kl", "entropy": "entropy",
          "generate_wasted_frac": "seconds (screening skipped included)", "zero_var_tokens_frac": "tokens",
          "screen_predicted_mixed": "predicted", "screen_observed_mixed": "observed"}
# One colour per run (matplotlib's tab10, which Bokeh calls Category10), cycled past ten runs; within a run,
# the series of one panel differ by dash (the PNG's and the page's in the same order), so no two look alike.
# The alarms' subset is a second greedy series on the held-out panel: a dash and marker of its own, so it is
# never mistaken for the full evaluation.
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
DASHES = ("solid", "dashed", "dotted", "dashdot", "dotdash")
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

    def panel_keys(self, patterns: Sequence[str]) -> list[str]:
        """The panel's metric keys this run logged, in the panel's order (its series)."""
        return [k for p in patterns for k in self.keys(p) if self.series(k)[0]]

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


# ---- what the PNG and the page share: colours, dashes, labels, notes ----

def run_color(run_index: int) -> str:
    return COLORS[run_index % len(COLORS)]


def series_dash(series_index: int) -> str:
    """The dash of a run's n-th series in a panel (Bokeh's names; png.py maps them to matplotlib's)."""
    return DASHES[series_index % len(DASHES)]


def marker(key: str) -> str | None:
    """The held-out series' markers (their points are few); None for a per-step curve."""
    if key == "heldout_subset_accuracy":
        return "square"
    if "pass@" in key:
        return "triangle"
    if "maj@" in key:
        return "diamond"
    return "circle" if key == "heldout_accuracy" else None


def scored_prompts(run: Run, key: str) -> int | None:
    """How many held-out prompts a greedy series scores: the full evaluation all of them (summary.json's
    heldout_size, else config.json's eval_size), the alarms' subset eval_subset - eval_train of them
    (all when eval_subset is 0), as grpo/observe/heldout.py draws it. None where the config does not say."""
    config = run.config
    full = (run.summary or {}).get("heldout_size") or config.get("eval_size")
    if key == "heldout_accuracy" or not full:
        return full
    if key != "heldout_subset_accuracy" or "eval_subset" not in config:
        return None
    if not config["eval_subset"]:
        return full
    return min(max(config["eval_subset"] - config.get("eval_train", 0), 1), full)


def label(key: str, run: Run, n_runs: int) -> str:
    text = LABELS.get(key) or key.removeprefix("heldout_")
    n = scored_prompts(run, key) if key in ("heldout_accuracy", "heldout_subset_accuracy") else None
    if n:
        text += f", {n} prompts"
    if "@" in key:
        text += f" ({run.config.get('eval_samples', '?')} samples)"
    return text if n_runs == 1 else f"{run.name}: {text}"


def within_unit(runs: Sequence[Run], key: str) -> bool:
    values = [v for r in runs for v in r.series(key)[1]]
    return bool(values) and 0.0 <= min(values) and max(values) <= 1.0


def panel_note(key: str, runs: Sequence[Run]) -> str:
    if key == "kl" and all(r.config.get("beta", 1) == 0 for r in runs):
        return "beta = 0: no KL term, no reference model"
    if key == "screen_predicted_mixed" and not any(run.series(key)[0] for run in runs):
        return "no screening in this run (--screen K turns it on)"
    if not any(run.series(key)[0] for run in runs):
        return "no values yet" + (" (no policy update so far)" if key == "entropy" else "")
    return ""


def alarm_steps(run: Run) -> list[int]:
    return sorted({r["step"] for r in run.records if any(r.get(f"alarm/{n}") for n in ALARMS)})
