"""examples/plain_grpo.py, the GRPO loop written against the public API, runs on the embedded model and learns."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^step\s+(\d+)\s+reward\s+(\S+)\s+mixed groups (\d+)/(\d+)\s+loss\s+(\S+)", re.MULTILINE)


def test_two_steps_print_finite_rewards_and_move_the_weights(tmp_path):
    from safetensors import safe_open

    from grpo.models import resolve_model_path

    saved = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "plain_grpo.py"), "--steps", "2", "--seed", "0",
         "--save", str(saved)],
        capture_output=True, text=True, cwd=tmp_path, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = STEP.findall(result.stdout)
    assert [int(s[0]) for s in steps] == [1, 2], result.stdout
    for _, reward, _, _, loss in steps:
        assert 0.0 <= float(reward) <= 1.0 and math.isfinite(float(loss))
    # A step whose groups all have equal rewards has A_i = 0 and no gradient; seed 0 draws one mixed group.
    assert sum(int(s[2]) for s in steps) > 0, f"no group with mixed rewards, nothing to learn from:\n{result.stdout}"
    assert re.search(r"held-out greedy accuracy at start: \d", result.stdout)
    assert re.search(r"held-out greedy accuracy at end: \d", result.stdout)

    start = Path(resolve_model_path("smollm2")) / "model.safetensors"
    moved = 0
    with safe_open(start, "pt") as before, safe_open(saved / "model.safetensors", "pt") as after:
        names = set(before.keys()) & set(after.keys())
        assert names
        for name in names:
            a, b = before.get_tensor(name), after.get_tensor(name)
            assert torch.isfinite(b).all(), name
            moved += not torch.equal(a, b)
    assert moved > len(names) // 2, f"only {moved} of {len(names)} tensors changed"
