"""`make mutants` stays runnable: every mutant's original text is in its file exactly once.

bench/mutants.py refuses to start when one is not (the list went stale once when the TIS
weights changed); this test says so at once, in CI, rather than tens of minutes into a run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_mutants() -> list[tuple[str, str, str, str]]:
    spec = importlib.util.spec_from_file_location("bench_mutants", ROOT / "bench" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


@pytest.mark.parametrize("path, original, mutated, why", load_mutants(), ids=lambda v: v if " " in str(v) else "")
def test_each_mutant_line_is_there_exactly_once(path, original, mutated, why):
    text = (ROOT / path).read_text()
    assert text.count(original) == 1, f"{path}: {why}: {original.strip()!r} found {text.count(original)} times"
    assert mutated != original, f"{path}: {why}: the mutant changes nothing"
