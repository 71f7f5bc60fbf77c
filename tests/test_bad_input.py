"""Each bad input: one line naming the problem, exit 2, no traceback, and no run directory left behind.

Every case runs the real command line (`python -m grpo train`) in a subprocess. None gets as far as
loading a model, so each takes a fraction of a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def grpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def place(tmp_path):
    """A folder with a stand-in model (its config.json is all the checks read) and some data files."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "broken-model").mkdir()
    (tmp_path / "broken-model" / "config.json").write_text("{not json")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "bad-json.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", answer: 4}\n')
    (tmp_path / "no-prompt.jsonl").write_text('{"query": "1+1", "answer": "2"}\n{"query": "2+2", "answer": "4"}\n')
    (tmp_path / "no-answer.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "3+3"}\n')
    (tmp_path / "typo.yaml").write_text("steps: 3\ngrop_size: 4\n")
    (tmp_path / "wrong-type.yaml").write_text("steps: ten\n")
    (tmp_path / "wrong-type.toml").write_text('lr = "fast"\n')
    (tmp_path / "broken.yaml").write_text("steps: [3\n")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("hello")
    return tmp_path


CASES = {
    "unknown config key": (["--config", "typo.yaml"], "unknown config key 'grop_size' (did you mean 'group_size'?)"),
    "unknown option": (["--grop-size", "4"], "unrecognized arguments: --grop-size 4 (did you mean --group-size?)"),
    "wrong type in yaml": (["--config", "wrong-type.yaml"], "steps must be of type int, got 'ten'"),
    "wrong type in toml": (["--config", "wrong-type.toml"], "lr must be of type float, got 'fast'"),
    "wrong type on the command line": (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    "config file not valid yaml": (["--config", "broken.yaml"], "config file broken.yaml is not valid YAML"),
    "config file missing": (["--config", "nope.yaml"], "cannot read config file nope.yaml: No such file or directory"),
    "missing model path": (["--model", "./no-such-model"], "model path not found: ./no-such-model"),
    "unreadable model": (["--model", "broken-model"], "model folder broken-model is unreadable: config.json"),
    "model folder without config": (["--model", "not-a-run"], "model folder not-a-run has no config.json"),
    "data file missing": (["--data", "nope.jsonl"], "data file not found: nope.jsonl"),
    "data file empty": (["--data", "empty.jsonl"], "empty.jsonl: no rows"),
    "data invalid json": (["--data", "bad-json.jsonl"], "bad-json.jsonl:2: invalid JSON (Expecting property name"),
    "data without prompt": (["--data", "no-prompt.jsonl"], "no-prompt.jsonl:1: no prompt field"),
    "data without answer": (["--data", "no-answer.jsonl"], "no-answer.jsonl:2: no answer field"),
    "group size below 2": (["--group-size", "1"], "group_size must be at least 2"),
    "batch size not a multiple": (["--batch-size", "30", "--group-size", "8"], "batch_size (30) must be a multiple of group_size (8)"),
    "zero max_new_tokens": (["--max-new-tokens", "0"], "max_new_tokens must be positive, got 0"),
    "zero steps": (["--steps", "0"], "steps must be positive, got 0"),
    "negative steps": (["--steps", "-3"], "steps must be positive, got -3"),
    "zero lr": (["--lr", "0"], "lr must be positive, got 0.0"),
    "negative lr": (["--lr=-1e-5"], "lr must be positive, got -1e-05"),
    "unknown reward": (["--rewards", "no_such_reward"], "unknown reward 'no_such_reward'"),
    "reward file missing": (["--rewards", "nope.py:score"], "reward file not found: nope.py"),
    "resume a non-run folder": (["--resume", "not-a-run"], "cannot resume not-a-run: not a run directory"),
    "resume a missing folder": (["--resume", "gone"], "cannot resume gone: no such directory"),
    "clip_low at 1": (["--clip-low", "1.0"], "clip_low must be below 1, got 1.0"),
    "more minibatches than prompts": (["--minibatches", "9", "--prompts-per-step", "8"], "minibatches (9) cannot exceed prompts_per_step (8)"),
    "batch size contradicts prompts": (["--batch-size", "16", "--prompts-per-step", "8", "--group-size", "4"], "batch_size (16) contradicts prompts_per_step (8)"),
    "weights without rewards": (["--reward-weights", "1.0", "2.0"], "reward_weights has 2 entries but rewards has 0"),
}


@pytest.mark.parametrize("args, message", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_clear_line(place, args, message):
    result = grpo("train", "--model", "model", *args, "--output", "run", cwd=place)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (place / "run").exists()
    assert not (place / "not-a-run" / "checkpoints").exists()


def test_existing_run_is_not_overwritten(place):
    run = place / "run"
    (run / "checkpoints" / "step-00000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    result = grpo("train", "--model", "model", "--output", "run", cwd=place)
    assert result.returncode == 2
    assert "output run already holds a run; continue it with --resume run" in result.stderr
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("command", [["train", "--model", "model", "--task", "code", "--output", "run"],
                                     ["check-reward", "--reward", "code_tests", "--task", "code"]])
def test_code_rewards_refuse_to_start_without_bubblewrap(place, command):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(place / "no-bwrap-here")}
    result = subprocess.run([sys.executable, "-m", "grpo", *command], cwd=place, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "bwrap is not installed" in lines[0] and "`bubblewrap`" in lines[0] and "--sandbox weak" in lines[0]
    assert not (place / "run").exists()


def test_unknown_sandbox_mode_is_one_clear_line(place):
    result = grpo("train", "--model", "model", "--task", "code", "--sandbox", "loose", "--output", "run", cwd=place)
    assert result.returncode == 2
    assert "sandbox must be one of strict, weak, got 'loose'" in result.stderr
