"""A run killed at any moment resumes from its latest complete checkpoint; SIGINT/SIGTERM stop it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from test_faults_checkpoint import REWARD, rows

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


def test_sigkill_at_random_moments_always_resumes_to_the_same_result(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "kill_harness.py"), str(tmp_path), "--kills", "20", "--seed", "1"],
        env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["kills"] >= 20
    assert report["mid_write"] >= 1, report  # kill_harness aims every fourth kill at a checkpoint being written
    assert report["went_back"] == 0
    assert report["finished_runs"] and all(report["identical"]), report


@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def _start(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grpo", "train", *args, "--no-progress"], cwd=cwd, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    # a generous limit: a loaded machine (CI beside other jobs) once took over 60 s to write the rows
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"fewer than {n} metrics rows after {timeout:.0f} s"
        time.sleep(0.02)


def test_sigterm_checkpoints_says_where_and_the_run_resumes(tmp_path, tiny_model_dir):
    # also: a YAML config with a command-line override, and the effective config in the run; rewards that vary,
    # so that the prompt sampler's state and the weights move, and a resume that lost them shows
    (tmp_path / "vary.py").write_text(REWARD)
    (tmp_path / "run.yaml").write_text(
        f"model: {tiny_model_dir}\ntask: add\nsteps: 1000\nsave_every: 1000\nprompts_per_step: 2\n"
        "group_size: 2\nmax_new_tokens: 4\neval_size: 4\ndevice: cpu\nthreads: 1\nsave_model: false\nlr: 0.5\n"
        "preflight: 'off'\nearly_stop: false\neval_every: 5\nalarm_window: 10\nrewards: vary.py:score\n"
    )  # the schedule given, not planned from the steps: the straight run below plans fewer
    proc = _start(tmp_path, "--config", "run.yaml", "--lr", "1e-3", "--output", "run")
    _wait_for_steps(tmp_path / "run", 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    last = err.strip().splitlines()[-1]
    step = len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) - 1  # less the step-0 evaluation
    assert f"stopped by SIGTERM after step {step}; latest checkpoint: run/checkpoints/step-{step:08d}" in last
    assert "grpo train --resume run" in last and "Traceback" not in err
    effective = json.loads((tmp_path / "run" / "config.json").read_text())
    assert effective["lr"] == 1e-3 and effective["steps"] == 1000 and effective["group_size"] == 2

    # the resume goes through the same command line, in-process to spare a second torch import
    from grpo.cli import main

    os.chdir(tmp_path)
    try:
        assert main(["train", "--resume", "run", "--steps", str(step + 2), "--no-progress"]) == 0
        # the straight run: the same command, the same steps, uninterrupted
        assert main(["train", "--config", "run.yaml", "--lr", "1e-3", "--steps", str(step + 2), "--output", "straight",
                     "--no-progress"]) == 0
    finally:
        os.chdir(ROOT)
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged] == [*range(0, step + 3), step + 2]  # first and last lines: held-out accuracy
    assert (tmp_path / "run" / "summary.json").exists()
    assert rows(tmp_path / "run") == rows(tmp_path / "straight")  # all but timings, bitwise
    assert latest_weights(tmp_path / "run") == latest_weights(tmp_path / "straight")


def latest_weights(run: Path) -> dict[str, list]:
    """The latest checkpoint's trainable weights, as lists (compared exactly)."""
    import grpo.run.checkpoint as checkpoint

    weights = torch.load(checkpoint.latest(run) / checkpoint.WEIGHTS, weights_only=True)
    return {name: tensor.tolist() for name, tensor in weights.items()}


def test_a_second_sigint_stops_at_once(tmp_path, tiny_model_dir):
    # a reward that takes 0.5 s a completion makes each step last 2 s: both signals land inside one
    (tmp_path / "slow.py").write_text("import time\n\ndef score(completion, example):\n    time.sleep(0.5)\n    return 0.0\n")
    proc = _start(tmp_path, "--model", str(tiny_model_dir), "--task", "add", "--steps", "1000", "--rewards", "slow.py:score",
                  "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2",
                  "--device", "cpu", "--threads", "1", "--no-save-model", "--output", "run", "--no-preflight",
                  "--no-early-stop")
    _wait_for_steps(tmp_path / "run", 1, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGINT: finishing the current step" in err
    assert "stopped at once" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # no checkpoint was due, and none was forced
