"""Faults injected into real `grpo train` runs, one at a time: each case asserts its outcome and its bound.

docs/faults.md tables them, with the times these tests measured. The runs use a tiny random model
(conftest.make_model) so that a case takes seconds; the bounds are the ones the docs promise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_model, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
SLOW_REWARD = "import time\n\ndef score(completion, example):\n    time.sleep(0.3)\n    return float('a' in completion)\n"


@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def start(cwd: Path, model: Path, *args: str) -> subprocess.Popen:
    """`grpo train` on the tiny model in a session of its own, as a terminal would hold it: a signal to
    its process group is what Ctrl-C sends."""
    cmd = [sys.executable, "-m", "grpo", "train", "--model", str(model), "--task", "add", "--prompts-per-step", "2",
           "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2", "--device", "cpu", "--threads", "1",
           "--no-save-model", "--no-preflight", "--no-early-stop", "--no-progress", "--output", "run", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until metrics.jsonl holds n lines (the step-0 evaluation is the first)."""
    deadline, metrics = time.monotonic() + timeout, run / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run took no step in time"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below pid (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            kids = [int(k) for k in (task / "children").read_text().split()] if (task / "children").exists() else []
            out += kids
            todo += kids
    return out


def rank_pid(launcher: int, rank: int) -> int:
    """The worker of that rank among the launcher's descendants (its RANK in its environment)."""
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"grpo" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no worker of rank {rank} under {launcher}")


def stopped_line(err: str, signame: str) -> int:
    """The step of the one line that says the run stopped, and where its checkpoint is."""
    lines = [line for line in err.splitlines() if f"stopped by {signame} after step" in line]
    assert len(lines) == 1, err[-3000:]
    step = int(re.search(r"after step (\d+)", lines[0]).group(1))
    assert f"latest checkpoint: run/checkpoints/step-{step:08d}" in lines[0], lines[0]
    return step


def test_sigint_to_one_rank_of_two_stops_both_after_the_same_step(tmp_path, tiny_model_dir):
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    proc = start(tmp_path, tiny_model_dir, "--nproc", "2", "--steps", "1000", "--rewards", "slow.py:score")
    try:
        wait_for_steps(tmp_path / "run", 2, proc)
        os.kill(rank_pid(proc.pid, 1), signal.SIGINT)  # rank 1 alone: rank 0 never sees a signal
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"fault: SIGINT to rank 1 of 2 -> both stopped in {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 130, err[-3000:]
    step = stopped_line(err, "SIGINT")
    logged = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == step + 1  # steps 1..step and the step-0 evaluation: no rank took another step
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()


def test_ctrl_c_under_nproc_2_rank_0_alone_speaks_without_a_traceback(tmp_path, tiny_model_dir):
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    proc = start(tmp_path, tiny_model_dir, "--nproc", "2", "--steps", "1000", "--rewards", "slow.py:score")
    try:
        wait_for_steps(tmp_path / "run", 2, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does at Ctrl-C: every process of the group
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"fault: Ctrl-C under --nproc 2 -> stopped in {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 130, err[-3000:]
    step = stopped_line(err, "SIGINT")
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()
    assert "no checkpoint was written" not in err and "Traceback" not in err and "SignalException" not in err, err
    assert err.count("SIGINT: finishing the current step") == 1, err
