"""`grpo report` on synthetic run directories: finished, in progress, two or three side by side.
tests/test_report_browser.py opens the page of real runs in a browser."""

import json
import math

import pytest

from grpo.cli import main
from grpo.observe.report import load_run, write_report


def make_run(path, steps=12, total=20, finished=False, reward_slope=0.03):
    """A run directory like the trainer writes, cut off after ``steps`` steps unless finished."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"steps": total, "lr": 3e-5, "group_size": 8}))
    lines = [json.dumps({"step": 0, "heldout_accuracy": 0.1, "heldout_pass@1": 0.12, "heldout_pass@4": 0.3,
                         "heldout_maj@4": 0.15})]
    for s in range(1, steps + 1):
        record = {"step": s, "reward_mean": 0.1 + reward_slope * s, "zero_var_frac": 0.5 - 0.01 * s,
                  "completion_len": 6.0, "completion_len_max": 8, "kl": 0.0, "entropy": 0.9 - 0.01 * s,
                  "alarm/stall": float(s >= 10)}
        if s % 5 == 0:
            record["heldout_accuracy"] = 0.1 + 0.02 * s
        lines.append(json.dumps(record))
    completions = [{"step": 10, "prompt": f"What is {i} + 1?", "answer": str(i + 1),
                    "completion": f"{i + 1}" if i % 2 else "<b>no</b>", "reward": float(i % 2), "advantage": 0.5}
                   for i in range(16)]
    (path / "completions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in completions))
    if finished:
        (path / "summary.json").write_text(json.dumps({"steps": total, "wall_seconds": 100.0,
                                                       "heldout_accuracy_end": 0.5}))
        text = "\n".join(lines) + "\n"
    else:
        text = "\n".join(lines) + '\n{"step": 13, "reward_me'  # the writer is mid-line
    (path / "metrics.jsonl").write_text(text)
    return path


def test_an_in_progress_run_reports_with_its_partial_last_line_skipped(tmp_path):
    run = load_run(make_run(tmp_path / "live"))
    assert run.summary is None and run.last_step == 12
    steps, values = run.series("heldout_accuracy")
    assert steps == [0, 5, 10]
    assert run.alarms() == {"stall": 10}
    png, page = write_report([run.path])
    assert png.name == "report.png" and png.stat().st_size > 10_000
    text = page.read_text()
    assert "in progress: step 12 of 20" in text
    assert "BokehJS" in text and "<script src" not in text and "<link" not in text  # all inline: opens offline
    assert "stall @ 10" in text
    assert " alarm: stall" in text  # named on the charts at its first step
    assert "&lt;b&gt;no&lt;/b&gt;" in text  # completions are escaped
    assert "pass@4 (" in text and "held-out greedy pass@1" in text


def test_a_slow_progress_note_is_shown_apart_and_never_as_an_alarm(tmp_path):
    # issue 52, item 15: slow progress is a note (summary.json's `notes`), no alarm: none in the alarm rows
    path = make_run(tmp_path / "slow", steps=20, finished=True)
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    (path / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "alarm/stall"}) + "\n"
                                                for r in records))
    note = "slow progress: held-out accuracy rose by 1.95 sd of its noise"
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "alarms": {}, "alarm_messages": {},
                                                   "notes": {"slow_progress": note}}))
    run = load_run(path)
    assert run.alarms() == {}
    import re

    from grpo.observe.report.page import headline

    rows = {cells[0]: cells[1] for row in headline([run]).split("<tr>")
            if len(cells := re.findall(r"<td>(.*?)</td>", row)) == 2}
    assert rows["alarms (first step on)"] == "none" and rows["alarm messages"] == "-"
    assert rows["notes (no alarm)"] == note


def test_two_runs_side_by_side_mark_config_differences(tmp_path):
    a = make_run(tmp_path / "a", finished=True, steps=20)
    b = make_run(tmp_path / "b", steps=8, reward_slope=0.0)
    (b / "config.json").write_text(json.dumps({"steps": 20, "lr": 1e-4, "group_size": 8}))
    png, page = write_report([a, b])
    assert png == a / "report-vs-b.png" and png.exists()
    text = page.read_text()
    assert "finished: 20 steps" in text and "in progress: step 8 of 20" in text
    assert text.count("<tr class=diff>") == 1  # only lr differs


def test_nan_metrics_are_skipped(tmp_path):
    run_dir = make_run(tmp_path / "r", finished=True)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 13, "reward_mean": 0.5, "entropy": None}) + "\n")
    run = load_run(run_dir)
    assert all(not math.isnan(v) for v in run.series("entropy")[1])
    write_report([run_dir])


def test_cli_report_and_its_errors(tmp_path, capsys):
    run_dir = make_run(tmp_path / "r")
    assert main(["report", str(run_dir)]) == 0
    assert "report.html" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report"])


def test_a_run_with_tools_shows_an_episode_and_its_tool_use(tmp_path):
    run_dir = make_run(tmp_path / "calc", finished=True)
    with (run_dir / "metrics.jsonl").open("a") as f:
        for s, calls in ((13, 0.25), (14, 0.875)):
            f.write(json.dumps({"step": s, "reward_mean": 0.4, "turns_per_episode": 1 + calls,
                                "tool_calls_per_episode": calls, "parse_failures": 3.0, "tool_errors": 1.0}) + "\n")
    transcript = [{"role": "user", "content": "What is 12 * 34 + 5?"},
                  {"role": "assistant", "content": '<tool>calculator("12 * 34 + 5")</tool>'},
                  {"role": "tool", "content": "413"}, {"role": "assistant", "content": "413"}]
    with (run_dir / "completions.jsonl").open("a") as f:
        for reward, t in ((1.0, transcript), (0.0, transcript[:1] + [{"role": "assistant", "content": "408"}])):
            f.write(json.dumps({"step": 14, "prompt": "q", "completion": t[-1]["content"], "reward": reward,
                                "transcript": t, "turns": len(t) // 2}) + "\n")
    text = write_report([run_dir])[1].read_text()
    assert "tool use (first step → latest)" in text
    assert "0.25 (step 13) → 0.88 (step 14)" in text  # tool calls per episode
    assert "reward 1, the best of its step" in text and "&lt;tool&gt;calculator(" in text and ">413<" in text
    plain = write_report([make_run(tmp_path / "add", finished=True)])[1].read_text()
    assert "tool use" not in plain and "an episode" not in plain


def test_the_seconds_per_step_show_each_side_s_wait_when_sampling_ahead(tmp_path):
    run = make_run(tmp_path / "async", finished=True, steps=4, total=4)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    timed = [json.dumps({**json.loads(line), "time_generate": 2.0, "time_update": 1.0, "time_wait_sampler": 0.5 * s,
                         "time_wait_trainer": 1.5, "async_lag": 1.0})
             if s else line for s, line in enumerate(lines)]
    (run / "metrics.jsonl").write_text("\n".join(timed) + "\n")
    text = write_report([run])[1].read_text()
    assert "seconds per step (mean)" in text
    # time_wait_sampler: (0.5 + 1.0 + 1.5 + 2.0) / 4 = 1.25; absent phases (time_sync) are not listed
    assert "<td>time_wait_sampler</td><td>1.25</td>" in text and "<td>time_wait_trainer</td><td>1.50</td>" in text
    assert "time_sync" not in text
    assert "<td>async_lag (updates)</td><td>1.00</td>" in text


def test_the_held_out_panel_tells_the_full_evaluation_from_the_alarms_subset(tmp_path):
    run_dir = make_run(tmp_path / "r", finished=True, steps=20)
    (run_dir / "config.json").write_text(json.dumps({"steps": 20, "eval_size": 256, "eval_subset": 128,
                                                     "eval_train": 32}))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    with_subset = [json.dumps({**json.loads(line), "heldout_subset_accuracy": 0.2})
                   if json.loads(line)["step"] % 4 == 0 else line for line in lines]
    (run_dir / "metrics.jsonl").write_text("\n".join(with_subset) + "\n")
    from grpo.observe.report import PANELS, figure

    fig = figure([load_run(run_dir)])
    held_out = fig.axes[[title for title, _, _ in PANELS].index("held-out accuracy")]
    lines = {line.get_label(): line for line in held_out.get_lines()}
    # 256 scored at the start and end; the alarms' subset is 128 - 32 training prompts = 96 held-out ones
    full, subset = lines["greedy pass@1, 256 prompts"], lines["subset (alarms), 96 prompts"]
    # the run's hue, but a shade, a dash and a marker of its own
    from matplotlib.colors import rgb_to_hsv, to_rgb

    hue = [float(rgb_to_hsv(to_rgb(line.get_color()))[0]) for line in (full, subset)]
    assert abs(hue[0] - hue[1]) < 0.01 and full.get_color() != subset.get_color()
    assert full.get_linestyle() != subset.get_linestyle() and full.get_marker() != subset.get_marker()
    legend = [text.get_text() for text in held_out.get_legend().get_texts()]
    assert "greedy pass@1, 256 prompts" in legend and "subset (alarms), 96 prompts" in legend


def test_three_runs_in_the_png_one_colour_each_and_no_two_series_of_a_panel_alike(tmp_path):
    from grpo.observe.report import PANELS, figure

    runs = [make_run(tmp_path / name, finished=True) for name in "abc"]
    for run in runs:  # the two panels whose two series were drawn alike: wasted generation, the screen's calibration
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        both = [{**r, "generate_wasted_frac": 0.3, "zero_var_tokens_frac": 0.4, "screen_predicted_mixed": 0.5,
                 "screen_observed_mixed": 0.6} if r["step"] else r for r in lines]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in both))
    from matplotlib.colors import rgb_to_hsv, to_rgb

    fig = figure([load_run(r) for r in runs])
    hues, first = {}, {}
    for ax, (title, _, _) in zip(fig.axes, PANELS, strict=True):
        colours = [line.get_color() for line in ax.get_lines()]
        assert len(colours) == len(set(colours)), title  # no two series of a panel in one colour
        for line in ax.get_lines():
            run = line.get_label().split(":")[0]
            hues.setdefault(run, set()).add(float(rgb_to_hsv(to_rgb(line.get_color()))[0]))
            first.setdefault(run, line.get_color())
    # one hue per run (its series are shades of it; hex rounding moves a hue by under 0.01)
    assert all(max(h) - min(h) < 0.01 for h in hues.values()), hues
    assert min(abs(min(hues[a]) - min(hues[b])) for a, b in (("a", "b"), ("b", "c"), ("a", "c"))) > 0.1
    assert first == {"a": "#1f77b4", "b": "#ff7f0e", "c": "#2ca02c"}
    wasted = fig.axes[[title for title, _, _ in PANELS].index("generation wasted on zero-variance groups")]
    assert len(wasted.get_lines()) == 6  # two series of each of the three runs
    png, page = write_report(runs)
    assert png.name == "report-vs-b-vs-c.png" and page.name == "report-vs-b-vs-c.html"


def test_the_config_is_a_table_of_values_not_json(tmp_path):
    run_dir = make_run(tmp_path / "r", finished=True)
    (run_dir / "config.json").write_text(json.dumps({"steps": 20, "reward_weights": [1.0, 0.5], "stop": [],
                                                     "eval_k": [1, 4], "lora": {"rank": 8, "targets": ["q", "v"]}}))
    text = write_report([run_dir])[1].read_text()
    config = text[text.index("<h2>config</h2>"):]
    config = config[: config.index("</table>")]
    for row in ("<td>reward_weights</td><td>1, 0.5</td>", "<td>stop</td><td>-</td>", "<td>eval_k</td><td>1, 4</td>",
                "<td>lora.rank</td><td>8</td>", "<td>lora.targets</td><td>q, v</td>"):
        assert row in config
    assert "[" not in config and "{" not in config


def test_the_groups_table_holds_each_completion_with_its_group(tmp_path):
    run_dir = make_run(tmp_path / "r", finished=True)  # its completions.jsonl predates group, length and cut:
    text = write_report([run_dir])[1].read_text()  # 16 completions of step 10, group_size 8: groups 0 and 1
    rows = text[text.index("<table id=groups>"):].split("</table>")[0].split("<tr ")[1:]
    assert len(rows) == 16
    assert [r.split("data-group='")[1].split("'")[0] for r in rows] == ["0"] * 8 + ["1"] * 8
    assert all("data-cut=''" in r and "data-step='10'" in r for r in rows)
    assert "class=odd" not in rows[7] and "class=odd" in rows[8]  # the second group in the other shade
    with (run_dir / "completions.jsonl").open("a") as f:
        f.write(json.dumps({"step": 12, "prompt": "p", "completion": "c", "reward": 1.0, "advantage": -0.5,
                            "group": 3, "length": 7, "cut": True}) + "\n")
    text = write_report([run_dir])[1].read_text()
    assert "data-group='3' data-reward='1.0' data-advantage='-0.5' data-length='7' data-cut='1'" in text
