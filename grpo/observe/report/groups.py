"""The page's groups: every completion written at the sampled steps (--sample-every), each prompt's group of G
together, with its reward, advantage, length and whether the token limit cut it; page.js filters the table by
run, step, reward, advantage sign and cut, and sorts it by a column. Reading a group's completions side by
side, with the rewards they got, is how a user sees reward hacking for themselves.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from grpo.observe.report.run import Run

# (header, the row's data attribute page.js sorts by, or None for text)
COLUMNS = (("run", "run"), ("step", "step"), ("group", "group"), ("reward", "reward"), ("advantage", "advantage"),
           ("length", "length"), ("cut", "cut"), ("prompt", None), ("completion", None))


def _group(completion: Mapping, index: int, group_size: int) -> int:
    """The group's index in its step's batch; for a completions.jsonl written before it was logged, from the
    completion's place among its step's (they are written in batch order, G per group)."""
    return int(completion["group"]) if "group" in completion else index // max(group_size, 1)


def _rows(run_index: int, run: Run) -> list[dict]:
    seen: dict[int, int] = {}
    rows = []
    for c in run.completions:
        index = seen[c["step"]] = seen.get(c["step"], -1) + 1
        rows.append({"run": run_index, "step": c["step"], "group": _group(c, index, run.config.get("group_size", 0)),
                     "reward": c["reward"], "advantage": c.get("advantage"), "length": c.get("length"),
                     "cut": c.get("cut"), "prompt": c["prompt"], "completion": c["completion"]})
    return rows


def _cell(key: str, value: object, runs: Sequence[Run]) -> str:
    if key == "run":
        return html.escape(runs[value].name)
    if key == "cut":
        return "-" if value is None else ("cut" if value else "")
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else html.escape(str(value))


def _number(value: object) -> str:
    """A data attribute page.js reads with Number(): "" where the completion did not log it."""
    if value is None:
        return ""
    return str(int(value)) if isinstance(value, bool) else str(value)


def _row(row: dict, shade: bool, runs: Sequence[Run]) -> str:
    data = " ".join(f"data-{attr}='{_number(row[attr])}'" for _, attr in COLUMNS if attr)
    cells = "".join(f"<td{'' if attr else ' class=text'}>{_cell(attr or name, row[attr or name], runs)}</td>"
                    for name, attr in COLUMNS)
    return f"<tr {data}{' class=odd' if shade else ''}>{cells}</tr>"


def groups_section(runs: Sequence[Run]) -> str:
    rows = [row for index, run in enumerate(runs) for row in _rows(index, run)]
    if not rows:
        return "<p>No completions.jsonl yet (a step's completions are written every sample_every steps).</p>"
    steps = sorted({row["step"] for row in rows})
    run_options = "".join(f"<option value={i}>{html.escape(r.name)}</option>" for i, r in enumerate(runs))
    filters = (
        "<p class=filters>"
        f"<label>run <select id=f-run><option value=''>all</option>{run_options}</select></label>"
        "<label>step <select id=f-step><option value=''>all</option>"
        + "".join(f"<option>{s}</option>" for s in steps) + "</select></label>"
        "<label>reward from <input id=f-reward-min type=number step=any size=6> to "
        "<input id=f-reward-max type=number step=any size=6></label>"
        "<label>advantage <select id=f-sign><option value=''>any</option><option value=1>&gt; 0</option>"
        "<option value=0>= 0</option><option value=-1>&lt; 0</option></select></label>"
        "<label>cut <select id=f-cut><option value=''>any</option><option value=1>cut by the token limit</option>"
        "<option value=0>not cut</option></select></label>"
        "<span id=groups-shown></span></p>"
    )
    head = "".join(f"<th data-key={attr}>{name}</th>" if attr else f"<th>{name}</th>" for name, attr in COLUMNS)
    body, shade, previous = [], False, None
    for row in rows:  # a group's rows share a shade, the next group's the other
        key = (row["run"], row["step"], row["group"])
        shade ^= previous is not None and key != previous
        body.append(_row(row, shade, runs))
        previous = key
    return (f"<p>Each prompt's group together (rows of one group share a shade); a column's name sorts by it "
            f"(again: the other way). {len(rows)} completions of {len(steps)} sampled step{'' if len(steps) == 1 else 's'}.</p>{filters}"
            f"<table id=groups><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
