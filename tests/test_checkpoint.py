"""Checkpoints: exact resume (full and LoRA), atomic writes, disk full, NaN/inf guards, state hooks."""

from __future__ import annotations

import errno
import math

import pytest
import torch
from tiny_run import metrics_lines, params, tiny_trainer

import grpo.run.checkpoint as checkpoint
from grpo.run.trainer import GRPOTrainer
from grpo.system.interrupt import RunStopped


def _same_params(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bitwise, not close


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_k_steps_then_resume_equals_n_steps_straight(tmp_path, lora):
    straight = tiny_trainer(steps=5, lora_rank=lora)
    summary_straight = straight.train(tmp_path / "straight")

    tiny_trainer(steps=2, lora_rank=lora).train(tmp_path / "split")  # a first run of 2 steps ...
    resumed = tiny_trainer(steps=5, lora_rank=lora)  # ... continued to 5 by a fresh process' worth of objects
    summary_resumed = resumed.train(tmp_path / "split", resume=True)

    _same_params(params(straight), params(resumed))
    assert metrics_lines(tmp_path / "straight") == metrics_lines(tmp_path / "split")
    assert (tmp_path / "straight" / "completions.jsonl").read_text() == (tmp_path / "split" / "completions.jsonl").read_text()
    for key in ("heldout_accuracy_start", "heldout_accuracy_end", "reward_mean_last"):
        assert summary_straight[key] == summary_resumed[key]


def test_resume_after_an_interrupted_step_drops_its_log_lines(tmp_path):
    straight = tiny_trainer(steps=4)
    straight.train(tmp_path / "straight")
    run = tmp_path / "run"
    tiny_trainer(steps=4, save_every=2).train(run)
    # pretend it died after logging step 4 but before its checkpoint: only step-2 remains
    for path in checkpoint.complete_checkpoints(run)[1:]:
        checkpoint._discard(path)
    (checkpoint.checkpoint_dir(run) / ".tmp-step-00000004-x").mkdir()  # a half-written one
    resumed = tiny_trainer(steps=4)
    resumed.train(run, resume=True)
    _same_params(params(straight), params(resumed))
    assert metrics_lines(tmp_path / "straight") == metrics_lines(run)
    assert not any(p.name.startswith(".tmp") for p in checkpoint.checkpoint_dir(run).iterdir())


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
    tiny_trainer(steps=5, save_every=1, keep_checkpoints=2).train(tmp_path / "run")
    names = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert sorted(names) == ["step-00000004", "step-00000005"]


def test_checkpoint_holds_the_named_state_with_its_format_and_nothing_else(tmp_path, monkeypatch):
    """The parts a checkpoint holds are the ones the trainer names (checkpoint_parts), not whatever stateful
    attributes it happens to have; a run that names another part cannot silently resume."""

    class Curriculum:
        def state_dict(self):
            return {"seen": {3: 2}}

        def load_state_dict(self, state):
            pass

    trainer = tiny_trainer(steps=1)
    trainer.curriculum = Curriculum()  # an attribute is not state until it is named
    trainer.train(tmp_path / "run")
    state = torch.load(checkpoint.latest(tmp_path / "run") / checkpoint.STATE, weights_only=False)
    assert state["format"] == checkpoint.FORMAT == 2
    assert sorted(state["parts"]) == ["batches", "draws", "prompt_rng", "sampler", "totals"]
    again = tiny_trainer(steps=1)
    again.train(tmp_path / "run", resume=True)
    assert again.prompt_rng.getstate() == trainer.prompt_rng.getstate()

    named = GRPOTrainer.checkpoint_parts
    monkeypatch.setattr(GRPOTrainer, "checkpoint_parts", lambda self: {**named(self), "curriculum": Curriculum()})
    with pytest.raises(checkpoint.CheckpointError, match="curriculum"):
        tiny_trainer(steps=1).train(tmp_path / "run", resume=True)


def as_format_1(path, *, totals: bool = True) -> None:
    """Rewrite checkpoint ``path``'s state.pt as the code before format 2 wrote it: no format, the trainer's
    stateful attributes by name (the batches sampled ahead as ``ahead``, none for the synchronous loop; no
    ``sampler`` for the uniform one, which had no state_dict; no ``totals`` before RunTotals existed)."""
    state = torch.load(path / checkpoint.STATE, weights_only=False)
    parts = dict(state.pop("parts"))
    batches = parts.pop("batches")
    if batches:
        parts["ahead"] = batches
    if parts["sampler"] == {}:
        del parts["sampler"]
    if not totals:
        del parts["totals"]
    del state["format"]
    torch.save({**state, "parts": parts}, path / checkpoint.STATE)


@pytest.mark.parametrize("options", [{}, {"async_lag": 1}, {"sampler": "frontier"}], ids=["sync", "async", "frontier"])
def test_a_checkpoint_of_format_1_resumes_as_the_unbroken_run(tmp_path, options):
    """The checkpoint layout before the format was named (grpo/run/checkpoint.py upgrade) still resumes, bitwise
    as the unbroken run. bench/same_as.py's resume case checks one written by that code itself."""
    straight = tiny_trainer(steps=4, **options)
    straight.train(tmp_path / "straight")
    straight.close()
    split = tiny_trainer(steps=2, **options)
    split.train(tmp_path / "split")
    split.close()
    as_format_1(checkpoint.latest(tmp_path / "split"))
    resumed = tiny_trainer(steps=4, **options)
    resumed.train(tmp_path / "split", resume=True)
    resumed.close()
    _same_params(params(straight), params(resumed))


def test_a_format_1_checkpoint_from_before_the_totals_restores_them_fresh(tmp_path):
    """RunTotals came after checkpoints of older runs: absent from one, they start at zero; any other part
    missing from a checkpoint is still refused."""
    tiny_trainer(steps=1).train(tmp_path / "run")
    as_format_1(checkpoint.latest(tmp_path / "run"), totals=False)
    resumed = tiny_trainer(steps=2)
    resumed.train(tmp_path / "run", resume=True)
    step_2 = next(r for r in metrics_lines(tmp_path / "run") if r.get("step") == 2 and "tokens_generated" in r)
    assert resumed.totals.sums["tokens_generated"] == step_2["tokens_generated"]  # counted from the resume on
    state = torch.load(checkpoint.latest(tmp_path / "run") / checkpoint.STATE, weights_only=False)
    del state["parts"]["draws"]
    torch.save(state, checkpoint.latest(tmp_path / "run") / checkpoint.STATE)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint holds state for"):
        tiny_trainer(steps=3).train(tmp_path / "run", resume=True)


def test_disk_full_keeps_the_previous_checkpoint_and_stops_clearly(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_write = checkpoint._write_file
    calls = {"n": 0}

    def fill_up(path, write):
        calls["n"] += 1
        if calls["n"] > 3:  # the first checkpoint (3 files) fits; the second runs out half-way
            with open(path, "wb") as f:
                f.write(b"\0" * 10)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, write)

    monkeypatch.setattr(checkpoint, "_write_file", fill_up)
    with pytest.raises(RunStopped) as stopped:
        tiny_trainer(steps=3).train(run)
    message = str(stopped.value)
    assert "No space left on device" in message and "step-00000001" in message, message
    assert "\n" not in message
    assert [p.name for p in checkpoint.checkpoint_dir(run).iterdir()] == ["step-00000001"]
    monkeypatch.setattr(checkpoint, "_write_file", real_write)
    resumed = tiny_trainer(steps=3)
    resumed.train(run, resume=True)  # the surviving checkpoint is whole
    assert checkpoint.read_meta(checkpoint.latest(run))["step"] == 3


def _nan_on_steps(bad_steps, **kw):
    """A tiny trainer whose rewards come out infinite on the given steps, as from a broken scorer: the
    advantages are NaN and so is the loss.

    (Reward functions themselves cannot do it: the scorer turns a non-finite
    reward into a counted error, and a NaN from the scorer marks an errored row, left out of training.)
    """
    now = {"step": 0}
    trainer = tiny_trainer(**kw)
    score, step = trainer.sampling.scoring.score, trainer.step

    def score_nan(texts, rows, *args, **kwargs):
        rewards, means = score(texts, rows, *args, **kwargs)
        return (torch.full_like(rewards, math.inf) if now["step"] in bad_steps else rewards), means

    def step_and_note(n):
        now["step"] = n
        return step(n)

    trainer.sampling.scoring.score, trainer.step = score_nan, step_and_note
    return trainer


def test_a_nan_step_skips_the_update_and_is_counted(tmp_path):
    trainer = _nan_on_steps({2}, steps=5)
    trainer.step(1)
    before = params(trainer)
    m = trainer.step(2)
    assert m["nonfinite_skipped"] == 1 and m["optimizer_steps"] == 0
    _same_params(before, params(trainer))
    later = [trainer.step(s) for s in (3, 4, 5)]
    assert all(m["nonfinite_skipped"] == 0 for m in later)
    assert sum(m["optimizer_steps"] for m in later) > 0  # training goes on


def test_too_many_bad_steps_stop_the_run_with_the_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    trainer = _nan_on_steps({3, 4, 5, 6}, steps=8, max_bad_steps=3)
    with pytest.raises(RunStopped) as stopped:
        trainer.train(run)
    message = str(stopped.value)
    assert "NaN/inf in 3 consecutive steps (the last at step 5)" in message
    assert "step-00000002" in message
    assert checkpoint.read_meta(checkpoint.latest(run))["step"] == 2
    logged = metrics_lines(run)
    assert [row["bad_steps_in_a_row"] for row in logged if "bad_steps_in_a_row" in row] == [0, 0, 1, 2, 3]


def test_a_run_resumed_in_a_new_process_is_bitwise_the_straight_run(tmp_path):
    """The CLI with its defaults (pre-flight check, frontier sampler, filter-groups, evaluations whose
    frequency is fixed from measured timings), 2 steps then resumed to 4 in separate processes: any state
    a checkpoint missed, or any computation that is not repeatable, would show here."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import make_model, make_tokenizer

    model = tmp_path / "tiny"
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), layers=4, hidden=64).save_pretrained(model)
    tokenizer.save_pretrained(model)
    root = Path(__file__).parent.parent
    # two threads: a backward that summed in a thread-dependent order made runs differ by ~4e-9 only then
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "2"}
    args = ["--model", str(model), "--task", "add", "--eval-size", "8", "--device", "cpu", "--no-progress",
            "--rewards", f"{root / 'tests' / 'distributed_worker.py'}:rare_first_char", "--save-every", "1"]

    def grpo(*extra: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "grpo", "train", *extra], env=env, capture_output=True,
                              text=True, timeout=300, cwd=root)
        assert proc.returncode == 0, proc.stderr[-4000:]

    grpo(*args, "--output", str(tmp_path / "straight"), "--steps", "4")
    grpo(*args, "--output", str(tmp_path / "split"), "--steps", "2")
    grpo("--resume", str(tmp_path / "split"), "--steps", "4", "--no-progress")
    for name in (checkpoint.WEIGHTS, checkpoint.STATE):
        a, b = (torch.load(checkpoint.latest(tmp_path / run) / name, weights_only=False) for run in ("straight", "split"))
        if name == checkpoint.WEIGHTS:
            _same_params(a, b)
        else:
            for key, value in a["optimizer"]["state"].items():
                for k, v in value.items():
                    assert torch.equal(v, b["optimizer"]["state"][key][k]), (key, k)
    # (evaluations aside: a 2-step run evaluates the full held-out set at its end, while the 4-step one scores
    # the alarms' subset and the fixed training sample at step 2)
    lines = [[{k: v for k, v in row.items() if not k.startswith(("heldout", "train_sample"))}
              for row in metrics_lines(tmp_path / run)]
             for run in ("straight", "split")]
    assert lines[0] == lines[1]




def test_a_state_written_before_the_modules_moved_is_read_under_their_new_names(tmp_path, monkeypatch):
    """A state.pt written before the package was put in folders by part names the old modules for the objects
    it pickled (--async-lag's batches sampled ahead: Rollout, then grpo.rollout): it reads as today's."""
    import sys

    from grpo.sampling.rollout import Rollout

    empty = torch.zeros(0, 0)
    rollout = Rollout(prompt_ids=[], completion_ids=empty.long(), mask=empty, logprobs=empty,
                      truncated=torch.zeros(0, dtype=torch.bool), texts=[], group_size=2)
    monkeypatch.setitem(sys.modules, "grpo.rollout", sys.modules["grpo.sampling.rollout"])
    monkeypatch.setattr(Rollout, "__module__", "grpo.rollout")
    torch.save({"parts": {"batches": {"ready": {3: rollout}}}}, tmp_path / checkpoint.STATE)
    monkeypatch.undo()  # the old module is gone, as after the move
    assert "grpo.rollout" not in sys.modules
    try:  # without the renaming the old name is not found (or, beside an older install, is another class)
        plain = type(torch.load(tmp_path / checkpoint.STATE, weights_only=False)["parts"]["batches"]["ready"][3])
    except ModuleNotFoundError:
        plain = None
    assert plain is not Rollout
    state = checkpoint.read_state(tmp_path)
    assert type(state["parts"]["batches"]["ready"][3]) is Rollout
