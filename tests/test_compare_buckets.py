"""bench/compare_samplers.py's difficulty buckets (issue 35: held-out accuracy per bucket must not fall behind)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from compare_samplers import bucket_accuracy, carry_bucket  # noqa: E402


def test_carry_by_units_digits():
    assert carry_bucket("What is 27 + 13? Reply with only the number.") == "carry"  # 7 + 3 = 10
    assert carry_bucket("What is 22 + 13?") == "no carry"
    assert carry_bucket("What is 42 - 13?") == "borrow"  # 2 < 3
    assert carry_bucket("What is 45 - 13?") == "no borrow"
    assert carry_bucket("Name a colour.") is None


def test_buckets_count_start_and_end_per_prompt():
    rows = [{"prompt": "What is 27 + 13?"}, {"prompt": "What is 22 + 13?"}, {"prompt": "What is 19 + 1?"},
            {"prompt": "Spell cat."}]
    start, end = (True, False, False, False), (False, True, True, True)
    got = bucket_accuracy(rows, start, end)
    assert got["solved at start"] == {"size": 1, "start": 1.0, "end": 0.0}
    assert got["unsolved at start"] == {"size": 3, "start": 0.0, "end": 1.0}
    assert got["carry"] == {"size": 2, "start": 0.5, "end": 0.5}
    assert got["no carry"] == {"size": 1, "start": 0.0, "end": 1.0}
    assert "borrow" not in got
