"""docs/from-trl-verl.md's commands, end to end on a tiny model: TRL's quick start (its
config values, its length reward unedited) as ``grpo train``, a separate evaluation file, and ``grpo eval``
scoring a held-out file with the reward a run trained on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_model, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TRL_REWARDS = ROOT / "tests" / "fixtures" / "foreign" / "trl_rewards.py"
VERL_REWARDS = ROOT / "tests" / "fixtures" / "foreign" / "verl_gsm8k.py"

# TRL's quick start: GRPOConfig(output_dir="Qwen2-0.5B-GRPO") on trl-lib/tldr, shrunk to a few tiny steps.
TRL_YAML = """\
output_dir: run
max_steps: 2
num_generations: 4
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
max_completion_length: 6
learning_rate: 1.0e-3
logging_steps: 1
save_steps: 1
bf16: true
report_to: none
"""


def grpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A tiny model folder, tldr-like data with only a prompt column, a TRL config."""
    place = tmp_path_factory.mktemp("trl")
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(place / "tiny")
    tokenizer.save_pretrained(place / "tiny")
    posts = [f"SUBREDDIT: r/tifu\nPOST: I forgot item {i} at the shop. TL;DR:" for i in range(12)]
    (place / "tldr.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in posts))
    held = [{"prompt": f"POST: held-out {i}. TL;DR:"} for i in range(3)]
    (place / "tldr_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    (place / "trl.yaml").write_text(TRL_YAML)
    (place / "always_one.py").write_text("def full_marks(completion, example):\n    return 1.0\n")
    return place


def test_trl_quick_start_runs_as_grpo_train(place):
    result = grpo("train", "--config", "trl.yaml", "--rewards", f"{TRL_REWARDS}:reward_len",
                  "--data", "tldr.jsonl", "--eval-data", "tldr_test.jsonl", "--model", "tiny",
                  "--device", "cpu", "--no-progress", "--sample-every", "1", "--reward-workers", "0",
                  "--save-model", cwd=place)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRL keys with no meaning in grpo, ignored: bf16, report_to" in result.stderr
    run = place / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["heldout_size"] == 3  # the evaluation file, not a split of the training data
    samples = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 8  # per_device_train_batch_size x gradient_accumulation_steps per step
    for s in samples:  # TRL's reward_len, called as TRL calls it: -|20 - len(completion)|
        assert s["reward"] == -abs(20 - len(s["completion"]))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/reward_len" in m for m in metrics)
    assert (run / "model" / "config.json").is_file()


def test_grpo_eval_scores_a_held_out_file_with_a_given_reward(place):
    base = ["eval", "--model", "tiny", "--data", "tldr_test.jsonl", "--rows", "first", "--samples", "0", "--max-new-tokens", "4",
            "--device", "cpu", "--json", "--stop", "\n\n", "--system-prompt", "Be brief."]
    full = grpo(*base, "--rewards", "always_one.py:full_marks", cwd=place)
    assert full.returncode == 0, full.stderr[-2000:]
    out = json.loads(full.stdout.strip().splitlines()[-1])
    assert (out["heldout_size"], out["heldout_accuracy"]) == (3, 1.0)
    lengths = grpo(*base, "--rewards", f"{TRL_REWARDS}:reward_len", cwd=place)  # at most 0: never "correct"
    assert lengths.returncode == 0, lengths.stderr[-2000:]
    assert json.loads(lengths.stdout.strip().splitlines()[-1])["heldout_accuracy"] == 0.0


def test_grpo_eval_with_a_verl_reward_on_gsm8k_rows(place):
    gsm8k = ROOT / "tests" / "fixtures" / "gsm8k_small.jsonl"
    result = grpo("eval", "--model", "tiny", "--data", str(gsm8k), "--eval-size", "2", "--samples", "0",
                  "--max-new-tokens", "2", "--device", "cpu", "--json",
                  "--rewards", f"{VERL_REWARDS}:compute_score", "--reward-style", "verl", cwd=place)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["heldout_size"] == 2


def test_grpo_eval_of_a_run_trained_on_rewards_scores_what_the_runs_held_out_scored(place):
    """A run on answered rows trained with its own --rewards (here: full marks for anything) reports held-out
    accuracy by the task's checker; grpo eval of its model, given nothing, prints that same figure, not the
    rewards' (which would be 100%)."""
    (place / "sums.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                                              for i in range(40)))
    trained = grpo("train", "--data", "sums.jsonl", "--rewards", "always_one.py:full_marks", "--model", "tiny",
                   "--steps", "1", "--eval-size", "8", "--group-size", "2", "--batch-size", "4",
                   "--max-new-tokens", "4", "--preflight", "off", "--device", "cpu", "--no-progress",
                   "--reward-workers", "0", "--save-model", "--output", "sums_run", cwd=place)
    assert trained.returncode == 0, trained.stderr[-3000:]
    metrics = [json.loads(line) for line in (place / "sums_run" / "metrics.jsonl").read_text().splitlines()]
    run_figure = [m["heldout_accuracy"] for m in metrics if "heldout_accuracy" in m][-1]
    assert run_figure < 1.0  # the checker's, not the rewards'
    result = grpo("eval", "--model", "sums_run/model", "--samples", "0", "--device", "cpu", "--json",
                  "--no-progress", cwd=place)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["heldout_size"], out["heldout_accuracy"]) == (8, run_figure)
