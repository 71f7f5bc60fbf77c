"""The same command twice gives the same run (issue 52, item 1): two processes of one command write the same
metrics rows and the same model; what a measurement chose (the clock, the pre-flight's pace, the memory
check, torch's threads) is said, and summary.json's `repeat` options repeat the run step for step."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics_lines, params, tiny_trainer

from grpo.cli import main

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from conftest import make_model, make_tokenizer

    place = tmp_path_factory.mktemp("model")
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=5).save_pretrained(place)
    tokenizer.save_pretrained(place)
    return place


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}) + "\n"
                            for i in range(60)))
    return path


def command(tiny_model: Path, data: Path, run: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--model", str(tiny_model), "--output", str(run), "--eval-size", "8",
            "--eval-subset", "8", "--eval-train", "4", "--prompts-per-step", "2", "--preflight-prompts", "2",
            "--reward-workers", "0", "--device", "cpu", "--no-progress", "--threads", "1", "--preflight", "warn", *extra]


def model_tensors(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


def same_run(a: Path, b: Path) -> None:
    assert metrics_lines(a) == metrics_lines(b)
    left, right = model_tensors(a), model_tensors(b)
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_two_processes_of_one_command_give_the_same_run(tmp_path, tiny_model, data):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("a", "b"):
        args = command(tiny_model, data, tmp_path / name, "--steps", "6", "--max-new-tokens", "8",
                       "--group-size", "4", "--eval-every", "2")
        subprocess.run([sys.executable, "-m", "grpo", *args], check=True, env=env, capture_output=True, timeout=600)
    same_run(tmp_path / "a", tmp_path / "b")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["environment"]["torch_threads"] == 1 and summary["environment"]["torch"] == torch.__version__
    assert set(summary["environment"]) == {"torch_threads", "torch", "transformers", "cpu_capability", "machine"}


def test_a_timed_run_says_what_was_measured_and_its_repeat_gives_the_same_run(tmp_path, tiny_model, data, capsys):
    # a --data run with no --steps has a time budget: the pre-flight's pace sets the step budget's amendments
    # (here the group size and rounds: 0.02 minutes fit few steps) and the clock the last step
    assert main(command(tiny_model, data, tmp_path / "timed", "--minutes", "0.02")) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "timed" / "summary.json").read_text())
    repeat = summary["repeat"]
    assert summary["out_of_time"] and repeat["steps"] == summary["steps"] and repeat["minutes"] == 0
    assert "group_size" in repeat and (repeat["eval_every"], repeat["alarm_window"]) == (
        summary["eval_every"], summary["alarm_window"])
    measured = [line for line in out.splitlines() if line.startswith("measured on this machine: ")]
    assert len(measured) == 1 and "the clock ends the run (0.02 minutes)" in measured[0]
    options = next(line for line in out.splitlines() if line.startswith("repeat it step for step: "))
    assert main(command(tiny_model, data, tmp_path / "again", "--minutes", "0.02",
                        *options.removeprefix("repeat it step for step: ").split())) == 0
    same_run(tmp_path / "timed", tmp_path / "again")


def test_a_clock_stopped_run_equals_steps_of_its_length(tmp_path):
    # evaluated every step, so the clock stops it at a step whose evaluation is scheduled: that evaluation
    # must not run (a --steps run of that length ends there with its final evaluation alone)
    timed = tiny_trainer(steps=200, minutes=0.01, eval_every=1)
    summary = timed.train(tmp_path / "timed")
    assert summary["out_of_time"] and summary["steps"] >= 1
    plain = tiny_trainer(steps=summary["steps"], eval_every=1)
    plain.train(tmp_path / "plain")
    assert metrics_lines(tmp_path / "timed") == metrics_lines(tmp_path / "plain")
    left, right = params(timed), params(plain)
    assert all(torch.equal(left[k], right[k]) for k in left)


def test_the_budget_counts_the_scheduled_evaluation_before_it_runs(monkeypatch):
    from grpo import run_state
    from grpo.run_state import TimeBudget

    now = [0.0]
    monkeypatch.setattr(run_state.time, "perf_counter", lambda: now[0])
    budget = TimeBudget(10.0, 0.0, evaluation=4.0, start=0.0)  # the start's evaluation took 4 s
    now[0] = 5.0  # one step of 5 s: another fits, but not with an evaluation of 4 s first
    assert not budget.spent(1, evaluates=False) and budget.spent(1, evaluates=True)
    budget.evaluated(1.0)  # the latest evaluation took 1 s: the next is expected to take as long
    now[0] = 5.5  # 5.5 s: 1 step and 1 s of evaluation, a pace of 4.5 s a step; 5.5 + 4.5 fit, + 1 do not
    assert not budget.spent(1, evaluates=False) and budget.spent(1, evaluates=True)
    now[0] = 3.0
    assert not budget.spent(1, evaluates=True)  # 3 + 2 + 1 of 10


def test_a_timed_run_ends_within_its_budget_whatever_its_evaluations_cost(tmp_path, monkeypatch):
    # evaluations of 2 s each after steps of a fraction of a second: a budget read before the step's evaluation
    # but blind to it ran one evaluation past --minutes (the run ended up to 2 s late)
    from grpo import trainer as trainer_module

    def slow(evaluate):
        def run(*args, **kwargs):
            time.sleep(2.0)
            return evaluate(*args, **kwargs)
        return run

    monkeypatch.setattr(trainer_module, "interim_evaluation", slow(trainer_module.interim_evaluation))
    monkeypatch.setattr(trainer_module, "full_evaluation", slow(trainer_module.full_evaluation))
    summary = tiny_trainer(steps=50, minutes=0.1, eval_every=1).train(tmp_path / "run")
    assert summary["out_of_time"] and summary["steps"] >= 2
    assert summary["train_seconds"] <= 6.0 + 0.3  # the budget, and the noise of a step's pace
