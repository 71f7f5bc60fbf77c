"""bench/same_as.py's comparison of two runs' rows: a metric the new code adds is skipped only where the old
rows lack it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from same_as import compare_rows  # noqa: E402


def test_an_added_metric_is_skipped_only_where_the_old_rows_lack_it():
    old = [{"step": 1, "loss": 0.5, "time_step": 3.0}]
    new = [{"step": 1, "loss": 0.5, "time_step": 4.0, "surplus_groups": 0}]
    assert "surplus_groups: old '(absent)' vs new 0" in compare_rows("metrics.jsonl", old, new)
    assert compare_rows("metrics.jsonl", old, new, {"surplus_groups"}) is None  # time_* is never compared
    both = [{**old[0], "surplus_groups": 1}]
    assert "surplus_groups" in compare_rows("metrics.jsonl", both, new, {"surplus_groups"})
    assert "loss" in compare_rows("metrics.jsonl", old, [{**new[0], "loss": 0.6}], {"surplus_groups"})
