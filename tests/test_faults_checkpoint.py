"""Faults at a checkpoint, injected into real `grpo train` runs: a signal while one is written (one process,
and every rank of a torchrun run), a SIGKILL in the middle of one, the disk full at one.

Each case that resumes is compared with the straight run of the same command, uninterrupted: metrics.jsonl's
rows but their timings (bench/same_as.py's rule: time_*, seconds_*, tokens_per_second) and the last
checkpoint's weights, bitwise, which is what a resume promises on the own engine at one world size.
docs/faults.md tables the cases with the times measured here (lines starting `fault:` under pytest -s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from test_faults import ENV, rank_pid, run, start, stopped_line

import grpo.run.checkpoint as checkpoint

pytestmark = pytest.mark.faults

# `grpo train` with the checkpoint writer patched first: FAULT=slow makes each file of a checkpoint take a
# second longer to write; FAULT=full fails checkpoint 2's first file with ENOSPC, as a full disk does
PATCHED = """import errno, os, sys, time
import grpo.run.checkpoint as checkpoint
from grpo.cli import main

real = checkpoint._write_file

def slow(path, write):
    time.sleep(1.0)
    real(path, write)

def full(path, write):
    if "step-00000002" in str(path):
        open("enospc_at", "w").write(repr(time.time()))
        raise OSError(errno.ENOSPC, "No space left on device")
    real(path, write)

checkpoint._write_file = slow if os.environ["FAULT"] == "slow" else full
sys.exit(main(sys.argv[1:]))
"""
# rewards that vary within a group, and a step size that moves the weights: a resume that lost any state shows
REWARD = "def score(completion, example):\n    return float(sum(map(ord, completion)) % 2)\n"
ARGS = ("--steps", "3", "--save-every", "1", "--lr", "1e-2", "--rewards", "vary.py:score")
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2")
TIMING = re.compile(r"^(time_|seconds_)|^tokens_per_second$")  # bench/same_as.py's IGNORED


def folder(where: Path) -> Path:
    """A working folder holding the reward and the patched CLI."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "vary.py").write_text(REWARD)
    (where / "patched.py").write_text(PATCHED)
    return where


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model, and the straight one-process run of ARGS every one-process case is compared with."""
    root = tmp_path_factory.mktemp("straight")
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(root / "tiny")
    tokenizer.save_pretrained(root / "tiny")
    done, _ = run(folder(root / "once"), root / "tiny", *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "tiny", root / "once" / "run"


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not TIMING.match(k)} for line in lines]


def assert_same_as_straight(run_dir: Path, straight_dir: Path) -> None:
    """Metrics rows (but timings) and the last checkpoint's weights, bitwise; and the weights moved."""
    assert rows(run_dir) == rows(straight_dir)
    ours, theirs = checkpoint.latest(run_dir), checkpoint.latest(straight_dir)
    assert ours.name == theirs.name == "step-00000003"
    mine, other = (torch.load(p / checkpoint.WEIGHTS, weights_only=True) for p in (ours, theirs))
    assert mine.keys() == other.keys() and all(torch.equal(mine[k], other[k]) for k in mine)
    first = torch.load(checkpoint.complete_checkpoints(straight_dir)[0] / checkpoint.WEIGHTS, weights_only=True)
    assert any(not torch.equal(first[k], other[k]) for k in first)  # the steps since the oldest kept moved them


def resume(cwd: Path, runner: tuple[str, ...] = ("-m", "grpo")) -> subprocess.CompletedProcess:
    """`grpo train --resume run` (the run's own steps); ``runner``: what python runs (torchrun, ...)."""
    cmd = [sys.executable, *runner, "train", "--resume", "run", "--no-progress"]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the run's whole session (the trainer, its workers, a launcher's ranks)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for_a_write(checkpoints: Path, proc: subprocess.Popen, step: int, timeout: float = 180) -> None:
    """Until checkpoint ``step`` is being written (its hidden folder exists)."""
    deadline = time.monotonic() + timeout
    while not list(checkpoints.glob(f".tmp-step-{step:08d}-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)


def start_slow_writes(tmp_path, model, monkeypatch):
    """A one-process run whose checkpoint files take a second each to write; its checkpoints folder."""
    monkeypatch.setitem(ENV, "FAULT", "slow")
    return start(folder(tmp_path), model, *ARGS, runner=("patched.py",)), tmp_path / "run" / "checkpoints"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_checkpoint_write_stops_after_the_next_step_and_resumes_as_straight(
        tmp_path, straight, monkeypatch, sig):
    model, once = straight
    proc, checkpoints = start_slow_writes(tmp_path, model, monkeypatch)
    try:
        wait_for_a_write(checkpoints, proc, 1)
        proc.send_signal(sig)  # in the middle of writing checkpoint 1 (three files, a second each)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            kill_all(proc)
    print(f"fault: {sig.name} during a checkpoint write -> stopped in {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 128 + sig, err[-3000:]
    assert stopped_line(err, sig.name) == 2  # the write completed, step 2 ran, its checkpoint was written
    assert not list(checkpoints.glob(".tmp-*")) and "Traceback" not in err
    done = resume(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_as_straight(tmp_path / "run", once)


def test_sigkill_in_the_middle_of_a_checkpoint_write_resumes_from_the_one_before_as_straight(
        tmp_path, straight, monkeypatch):
    model, once = straight
    proc, checkpoints = start_slow_writes(tmp_path, model, monkeypatch)
    try:
        wait_for_a_write(checkpoints, proc, 2)
        deadline = time.monotonic() + 60
        while not list(checkpoints.glob(f".tmp-step-00000002-*/{checkpoint.WEIGHTS}")):  # its first file written,
            assert time.monotonic() < deadline  # the next one a second away
            time.sleep(0.01)
    finally:
        kill_all(proc)  # the trainer and its reward workers, at once
        proc.communicate()
    partial = [p.name for p in checkpoints.iterdir() if p.name.startswith(".tmp-step-00000002-")]
    assert len(partial) == 1 and (checkpoints / partial[0] / checkpoint.WEIGHTS).is_file(), partial
    assert checkpoint.latest(tmp_path / "run").name == "step-00000001"  # the partial one is not taken
    began = time.monotonic()
    done = resume(tmp_path)
    print(f"fault: SIGKILL mid-write -> resumed from step 1 and finished 2 steps in {time.monotonic() - began:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(checkpoints.glob(".tmp-*"))  # the partial folder removed
    assert_same_as_straight(tmp_path / "run", once)


def test_sigterm_to_every_torchrun_rank_during_a_checkpoint_write_stops_and_resumes_as_straight(
        tmp_path, straight, monkeypatch):
    """torchrun, 2 ranks (gloo, CPU), each rank SIGTERMed while rank 0 writes checkpoint 1, as a scheduler
    ending a job signals every worker: both stop after step 2 with its checkpoint, rank 0 alone says so,
    and the run resumed on 2 ranks ends as the straight 2-rank run does."""
    model, _ = straight
    monkeypatch.setitem(ENV, "FAULT", "slow")
    proc = start(folder(tmp_path / "cut"), model, *ARGS, runner=(*TORCHRUN, "patched.py"))
    checkpoints = tmp_path / "cut" / "run" / "checkpoints"
    try:
        wait_for_a_write(checkpoints, proc, 1)
        for pid in [rank_pid(proc.pid, rank) for rank in (0, 1)]:  # the workers, not torchrun's agent
            os.kill(pid, signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            kill_all(proc)
    print(f"fault: SIGTERM to both torchrun ranks during a checkpoint write -> stopped in "
          f"{time.monotonic() - sent:.1f} s")
    assert stopped_line(err, "SIGTERM") == 2 and err.count("SIGTERM: finishing the current step") == 1, err[-3000:]
    assert "exitcode  : 143" in err, err[-3000:]  # torchrun's report: a rank that stopped as asked
    assert f'File "{Path(checkpoint.__file__).parent}' not in err, err[-3000:]  # no traceback of the run's own
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000001", "step-00000002"]
    done = resume(tmp_path / "cut", (*TORCHRUN, "-m", "grpo"))
    assert done.returncode == 0, done.stderr[-3000:]
    whole, _ = run(folder(tmp_path / "whole"), model, *ARGS, runner=(*TORCHRUN, "-m", "grpo"), timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert_same_as_straight(tmp_path / "cut" / "run", tmp_path / "whole" / "run")


def test_a_full_disk_at_a_checkpoint_says_so_in_one_line_and_keeps_the_previous_one(tmp_path, straight,
                                                                                 monkeypatch):
    model, once = straight
    monkeypatch.setitem(ENV, "FAULT", "full")
    done, _ = run(folder(tmp_path), model, *ARGS, runner=("patched.py",))
    took = time.time() - float((tmp_path / "enospc_at").read_text())
    print(f"fault: disk full at checkpoint 2 -> one line and exit in {took:.1f} s")
    assert done.returncode == 1 and took < 10, done.stderr[-3000:]
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("grpo train: cannot write checkpoint") and "No space left on device" in last, last
    assert "the latest complete checkpoint is still run/checkpoints/step-00000001" in last, last
    assert "Traceback" not in done.stderr
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-00000001"]
    resumed = resume(tmp_path)  # the disk has room again
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_as_straight(tmp_path / "run", once)
