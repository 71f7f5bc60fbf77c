"""Re-judges finished runs with the alarms as they are now: feeds each run's metrics.jsonl through
grpo.observe.alarm_monitor.AlarmMonitor as the trainer fed it (step 0's evaluation, each step with the evaluations
merged into it, the final evaluation as final) and prints what it raises, and when.

    python bench/replay_alarms.py RUN_DIR [RUN_DIR ...]

The alarms are a function of the recorded metrics, so a replay is the verdict the run would have got
with the current rules, as long as the evaluation schedule is the same (it is planned before step 1
from the planned steps alone; a run recorded before that change is replayed on its own, time-based
schedule, which the current trainer would not have used). The alarm window is summary.json's (what the
run used), else config.json's; the subset's sizes come from config.json (eval_subset, eval_train,
eval_size; the whole held-out set's size from summary.json's heldout_size where the run finished), which is
what the trainer uses unless the data has fewer prompts than those.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grpo.observe.alarm_monitor import AlarmMonitor
from grpo.observe.alarms import AlarmConfig


def replay(run: Path) -> dict[str, int]:
    """Each alarm the current rules raise on the run, with the step it was first raised at."""
    config = json.loads((run / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = max(row["step"] for row in rows)
    train_n = int(config["eval_train"])
    subset = int(config["eval_subset"])
    full_n = int(summary.get("heldout_size") or config["eval_size"])  # the whole held-out set, start and end
    heldout_n = max(min(subset - train_n, full_n), 1) if subset else full_n
    window = int(summary.get("alarm_window") or config["alarm_window"])
    watched = any(row.get("heldout_subset_accuracy", row.get("heldout_accuracy")) is not None for row in rows)
    monitor = AlarmMonitor(int(config["steps"]), AlarmConfig(
        window=window, no_signal_steps=int(config["no_signal_steps"]), heldout_n=heldout_n, train_n=train_n,
        full_n=full_n),
        watch_heldout=watched)
    raised: dict[str, int] = {}
    finals = [i for i, row in enumerate(rows) if row["step"] == steps and "reward_mean" not in row]
    for i, row in enumerate(rows):
        final = bool(finals) and i == finals[-1] and steps > 0
        for name in monitor.observe(row["step"], row, final=final)[1]:
            raised.setdefault(name, row["step"])
    return raised


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python bench/replay_alarms.py RUN_DIR [RUN_DIR ...]")
    for arg in sys.argv[1:]:
        run = Path(arg)
        if not (run / "metrics.jsonl").is_file() or not (run / "config.json").is_file():
            sys.exit(f"{run}: not a run directory (no metrics.jsonl and config.json)")
        raised = replay(run)
        said = ", ".join(f"{name} (step {step})" for name, step in raised.items()) or "no alarm"
        print(f"{run}: {said}")


if __name__ == "__main__":
    main()
