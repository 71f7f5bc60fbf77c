"""The same command twice gives the same run (issue 52, item 1): two processes of one command write the same
metrics rows and the same model; what a measurement chose (the clock, the pre-flight's pace, the memory
check, torch's threads) is said, and summary.json's `repeat` options repeat the run step for step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics_lines, params, tiny_trainer

from grpo.cli import main

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}) + "\n"
                            for i in range(60)))
    return path


def command(tiny_model_folder: Path, data: Path, run: Path, *extra: str, threads: bool = True) -> list[str]:
    return ["train", "--data", str(data), "--model", str(tiny_model_folder), "--output", str(run), "--eval-size", "8",
            "--eval-subset", "8", "--eval-train", "4", "--prompts-per-step", "2", "--preflight-prompts", "2",
            "--reward-workers", "0", "--device", "cpu", "--no-progress", *(["--threads", "1"] if threads else []),
            "--preflight", "warn", *extra]


def stop_at(monkeypatch, step: int) -> None:
    """The time budget is spent after this step of the process, on any machine (no wall clock read)."""
    from grpo.run.run_state import TimeBudget

    monkeypatch.setattr(TimeBudget, "spent", lambda self, steps_done, evaluates: steps_done >= step)


def fake_clock(monkeypatch) -> list[float]:
    """The clock the time budget reads, as a list of one value that the test advances."""
    from grpo.run.run_state import TimeBudget

    now = [0.0]
    monkeypatch.setattr(TimeBudget, "now", staticmethod(lambda: now[0]))
    return now


def model_tensors(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "model" / "model.safetensors"))


def same_run(a: Path, b: Path) -> None:
    assert metrics_lines(a) == metrics_lines(b)
    left, right = model_tensors(a), model_tensors(b)
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def test_two_processes_of_one_command_give_the_same_run(tmp_path, tiny_model_folder, data):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("a", "b"):
        args = command(tiny_model_folder, data, tmp_path / name, "--steps", "6", "--max-new-tokens", "8",
                       "--group-size", "4", "--eval-every", "2")
        subprocess.run([sys.executable, "-m", "grpo", *args], check=True, env=env, capture_output=True, timeout=600)
    same_run(tmp_path / "a", tmp_path / "b")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["environment"]["torch_threads"] == 1 and summary["environment"]["torch"] == torch.__version__
    assert set(summary["environment"]) == {"torch_threads", "torch", "transformers", "cpu_capability", "machine"}


def test_a_timed_run_says_what_was_measured_and_its_repeat_gives_the_same_run(tmp_path, tiny_model_folder, data, capsys,
                                                                            monkeypatch):
    # a --data run with no --steps has a time budget: the pre-flight's pace (here a fixed one, slow enough
    # that 0.02 minutes fit no step) sets the step budget's amendments, the clock (here one spent after step 6)
    # the last step; the evaluations are planned for the budget's 20 steps (every 4; --steps 6 plans every 2),
    # torch's threads are the machine's
    import grpo.run.trainer as trainer_module

    def slow(*args, **kwargs):
        report = preflight(*args, **kwargs)
        report.step_seconds = report.update_seconds = 60.0
        return report

    preflight = trainer_module.run_preflight
    monkeypatch.setattr(trainer_module, "run_preflight", slow)
    stop_at(monkeypatch, 6)
    assert main(command(tiny_model_folder, data, tmp_path / "timed", "--minutes", "0.02", threads=False)) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "timed" / "summary.json").read_text())
    repeat = summary["repeat"]
    assert summary["out_of_time"] and summary["steps"] == 6 and summary["eval_every"] == 4
    chosen = json.loads((tmp_path / "timed" / "config.json").read_text())
    adapted = {name: chosen[name] for name in ("group_size", "max_gen_rounds", "max_new_tokens",
                                               "max_episode_tokens") if name in repeat}
    assert "group_size" in adapted and repeat == {**adapted, "steps": 6, "minutes": 0, "preflight": "off",
                                                  "eval_every": 4, "alarm_window": 10,  # --steps 6's: 2, 6
                                                  "threads": torch.get_num_threads()}
    measured = [line for line in out.splitlines() if line.startswith("measured on this machine: ")]
    assert len(measured) == 1 and "the clock ends the run (0.02 minutes)" in measured[0]
    assert f"torch uses {torch.get_num_threads()} threads" in measured[0]
    options = next(line for line in out.splitlines() if line.startswith("repeat it step for step: "))
    assert main(command(tiny_model_folder, data, tmp_path / "again", "--minutes", "0.02",
                        *options.removeprefix("repeat it step for step: ").split(), threads=False)) == 0
    same_run(tmp_path / "timed", tmp_path / "again")
    rows = metrics_lines(tmp_path / "again")
    assert [row["step"] for row in rows if "heldout_subset_accuracy" in row] == [0, 4, 6]  # --steps 6: 0, 2, 4, 6


def test_a_clock_stopped_run_equals_steps_of_its_length(tmp_path, monkeypatch):
    # evaluated every step, so the clock stops it at a step whose evaluation is scheduled: that evaluation
    # must not run (a --steps run of that length ends there with its final evaluation alone)
    stop_at(monkeypatch, 3)
    timed = tiny_trainer(steps=200, minutes=1.0, eval_every=1)
    summary = timed.train(tmp_path / "timed")
    assert summary["out_of_time"] and summary["steps"] == 3 and summary["repeat"]["steps"] == 3
    plain = tiny_trainer(steps=3, eval_every=1)
    plain.train(tmp_path / "plain")
    assert metrics_lines(tmp_path / "timed") == metrics_lines(tmp_path / "plain")
    left, right = params(timed), params(plain)
    assert all(torch.equal(left[k], right[k]) for k in left)


def test_the_repeat_of_a_run_no_clock_ended_gives_its_planned_steps_and_an_automatic_schedule():
    # an alarm, not the clock, ended the timed run after step 7: its repeat plans the same steps, so that its
    # schedule evaluates where the run did and the alarm stops it at step 7 as well; --eval-every 0 given
    # is as automatic as none given, and the repeat names the schedule it planned
    from grpo.config import TrainConfig
    from grpo.run.repeat import repeat_options
    from grpo.run.run_state import RunState

    config = TrainConfig(steps=20, minutes=1.0, eval_every=0, alarm_window=10, threads=1, preflight="off")
    state = RunState(step=7, eval_every=4, alarm_window=10)
    for sources in ({}, {"eval_every": "cli"}):
        alarm = repeat_options(config, sources, state, out_of_time=False)
        assert alarm == {"steps": 20, "minutes": 0, "eval_every": 4, "alarm_window": 10}
        assert repeat_options(config, sources, state, out_of_time=True)["steps"] == 7
    given = TrainConfig(steps=20, minutes=1.0, eval_every=3, alarm_window=8, threads=1, preflight="off")
    assert repeat_options(given, {"eval_every": "cli", "alarm_window": "cli"}, state, out_of_time=True) == {
        "steps": 7, "minutes": 0}


def test_the_budget_counts_the_scheduled_evaluation_before_it_runs(monkeypatch):
    from grpo.run.run_state import TimeBudget

    now = fake_clock(monkeypatch)
    budget = TimeBudget(10.0, 0.0, evaluation=4.0, start=0.0)  # the start's evaluation took 4 s
    now[0] = 5.0  # one step of 5 s: another fits, but not with an evaluation of 4 s first
    assert not budget.spent(1, evaluates=False) and budget.spent(1, evaluates=True)
    budget.evaluated(1.0)  # the latest evaluation took 1 s: the next is expected to take as long
    now[0] = 5.5  # 5.5 s: 1 step and 1 s of evaluation, a pace of 4.5 s a step; 5.5 + 4.5 fit, + 1 do not
    assert not budget.spent(1, evaluates=False) and budget.spent(1, evaluates=True)
    now[0] = 3.0
    assert not budget.spent(1, evaluates=True)  # 3 + 2 + 1 of 10


def test_a_timed_run_ends_within_its_budget_whatever_its_evaluations_cost(tmp_path, monkeypatch):
    # on a fake clock: the start's evaluation and each later one take 2 s, a step 0.5 s, the budget is 6 s.
    # After step 1 (0.5 s) and step 2 (3 s) an evaluation and one more step fit; after step 3 (5.5 s) the
    # evaluation does not, so the run stops there (a budget read before the step's evaluation but blind to it
    # ran that evaluation, and ended at 8 s)
    import grpo.run.run_ends as run_ends
    import grpo.run.trainer as trainer_module
    from grpo.run.trainer import GRPOTrainer

    now, began = fake_clock(monkeypatch), []

    def costs(seconds, run, starts=None):
        def timed(*args, **kwargs):
            if starts is not None:
                starts.append(now[0])
            now[0] += seconds
            return run(*args, **kwargs)
        return timed

    monkeypatch.setattr(trainer_module, "interim_evaluation", costs(2.0, trainer_module.interim_evaluation, began))
    # the start's evaluation runs in grpo/run/run_ends.py, the final one in the loop: each is timed where it is called
    monkeypatch.setattr(run_ends, "full_evaluation", costs(2.0, run_ends.full_evaluation))
    monkeypatch.setattr(trainer_module, "full_evaluation", costs(2.0, trainer_module.full_evaluation))
    monkeypatch.setattr(GRPOTrainer, "step", costs(0.5, GRPOTrainer.step))
    summary = tiny_trainer(steps=50, minutes=0.1, eval_every=1).train(tmp_path / "run")
    assert summary["out_of_time"] and summary["steps"] == 3 and summary["train_seconds"] == 5.5
    assert [start - 2.0 for start in began] == [0.5, 3.0]  # into the budget, which starts after the first
    assert all(start - 2.0 + 2.0 + 0.5 <= 6.0 for start in began)  # each left room for itself and a step


def test_evaluations_change_no_training_row_nor_weight(tmp_path):
    # issue 52: two runs of one command parted at step 5, the first step after the first interim evaluation.
    # Evaluations draw from streams of their own (grpo/sampling/random_streams.py, step 0) and leave the model as they found
    # it, so a run evaluated every step trains what a run evaluated only at its start and end does
    training = {}
    for every in (1, -1):
        trainer = tiny_trainer(steps=6, eval_every=every, filter_groups=True, temperature=0.7, max_new_tokens=8)
        trainer.train(tmp_path / str(every))
        rows = [row for row in metrics_lines(tmp_path / str(every)) if "reward_mean" in row]
        training[every] = ([{k: v for k, v in row.items() if "heldout" not in k and "train_sample" not in k}
                            for row in rows], params(trainer))
    (rows_a, weights_a), (rows_b, weights_b) = training[1], training[-1]
    assert len(rows_a) == 6 and rows_a == rows_b
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
