"""Asynchronous GRPO (--async-lag K, grpo/run/async_batches.py): the lag is exactly K, the weights each batch samples with
are those K updates old, no prompt is in flight twice, and an interrupted run resumes bitwise."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading

import pytest
import torch
from tiny_run import metrics_lines, params, tiny_trainer

from grpo.config import ConfigError
from grpo.run.async_batches import SamplingAhead
from grpo.run.batch_source import EachStep
from grpo.run.checkpoint import CheckpointError
from grpo.sampling.rounds import sample_batch
from grpo.system.interrupt import RunStopped

pytestmark = pytest.mark.equivalence


def watch(trainer):
    """Record the weights after each step and, for each batch the thread samples, the weights it loaded."""
    after = {0: params(trainer)}  # step -> the trainer's weights after its update (0: the start)
    sampled_with = {}  # step -> (version, the sampler copy's weights when it sampled that batch)
    prompts = {}  # step -> the prompts its batch drew
    step, sample = trainer.step, trainer.batches._sample

    def stepped(s):
        out = step(s)
        after[s] = params(trainer)
        return out

    def sampled(job):
        batch, seconds = sample(job)
        copy = {n: p.detach().clone() for n, p in trainer.batches.sampling.generation.model.named_parameters()}
        sampled_with[job.step] = (job.version, copy)
        prompts[job.step] = {i for r in batch.rounds for i in r.prompts}
        return batch, seconds

    trainer.step, trainer.batches._sample = stepped, sampled
    return after, sampled_with, prompts


@pytest.mark.parametrize("lag", [1, 2])
def test_batch_t_samples_with_the_weights_after_update_t_minus_1_minus_k(tmp_path, lag):
    trainer = tiny_trainer(steps=6, async_lag=lag)
    after, sampled_with, prompts = watch(trainer)
    try:
        trainer.train(tmp_path / "run")
    finally:  # the thread ends with the trainer, also when the run fails
        trainer.close()
    assert sorted(sampled_with) == list(range(1, 7))  # no batch beyond the last step is sampled
    for t, (version, weights) in sampled_with.items():
        assert version == max(0, t - 1 - lag)
        for name, value in weights.items():
            assert torch.equal(value, after[version][name]), (t, name)
    # each step's metrics carry its batch's lag: the start's weights for the first K + 1 batches, then K
    rows = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if "async_lag" in r]
    assert [r["async_lag"] for r in rows] == [float(min(lag, t - 1)) for t in range(1, 7)]
    assert all(r["time_wait_sampler"] >= 0 and r["time_wait_trainer"] >= 0 for r in rows)
    # no prompt drawn while it is in flight: batch t shares none with batches t - K .. t - 1
    for t in range(2, 7):
        flight = set().union(*(prompts[s] for s in range(max(1, t - lag), t)))
        assert not prompts[t] & flight, t


def test_the_lagged_run_differs_from_the_synchronous_one(tmp_path):
    """The lag is real: the same seed with K = 1 trains on other samples than K = 0 from step 2 on."""
    runs = {}
    for lag in (0, 1):
        trainer = tiny_trainer(steps=3, async_lag=lag)
        trainer.train(tmp_path / f"k{lag}")
        trainer.close()
        runs[lag] = [{k: v for k, v in r.items() if k != "async_lag"} for r in metrics_lines(tmp_path / f"k{lag}")]
    assert runs[0][1] == runs[1][1]  # step 1: both sample with the starting weights
    assert runs[0][2] != runs[1][2]


# the defaults a user runs with: the frontier sampler (its statistics in the checkpoint), dynamic sampling's
# extra rounds, held-out evaluations during the run (the thread idle meanwhile)
FULL = dict(sampler="frontier", filter_groups=True, eval_every=3)


def test_an_interrupted_async_run_resumes_bitwise(tmp_path):
    """K = 2, stopped by SIGINT after step 5 of 8 (its checkpoint holds batches 6 and 7, sampled ahead), then
    resumed by fresh objects: the weights, metrics and samples are the unbroken run's, bit for bit."""
    straight = tiny_trainer(steps=8, async_lag=2, save_every=100, **FULL)
    straight.train(tmp_path / "straight")
    straight.close()

    stopped = tiny_trainer(steps=8, async_lag=2, save_every=100, **FULL)
    step = stopped.step

    def interrupted(s):
        out = step(s)
        if s == 5:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the run: checkpoint after this step, then stop
        return out

    stopped.step = interrupted
    with pytest.raises(RunStopped, match="stopped by SIGINT after step 5"):
        stopped.train(tmp_path / "split")
    stopped.close()
    state = torch.load(next((tmp_path / "split" / "checkpoints").iterdir()) / "state.pt", weights_only=False)
    assert sorted(state["parts"]["batches"]["ready"]) == [6, 7]  # sampled ahead, not yet trained on

    resumed = tiny_trainer(steps=8, async_lag=2, save_every=100, **FULL)
    resumed.train(tmp_path / "split", resume=True)
    resumed.close()
    a, b = params(straight), params(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    lines = metrics_lines(tmp_path / "straight")
    assert lines == metrics_lines(tmp_path / "split")
    assert any("heldout_subset_accuracy" in r for r in lines) and any(r.get("gen_rounds", 1) > 1 for r in lines)
    assert ((tmp_path / "straight" / "completions.jsonl").read_text()
            == (tmp_path / "split" / "completions.jsonl").read_text())


def test_a_failure_in_the_sampling_thread_reaches_the_trainer_at_its_step(tmp_path):
    """The training reward (not the checker, which evaluates in the trainer's thread) fails on batch 2's
    prompts: batch 1 is trained, then the error comes out of next at step 2, and the thread is gone."""
    from conftest import make_model, make_tokenizer
    from tiny_run import count_a, tiny_config, tiny_task

    from grpo.run.build import resolve_run
    from grpo.run.trainer import GRPOTrainer

    calls = []

    def broken(completion, example):
        calls.append(1)
        if len(calls) > 4 * 4:  # batch 1's 16 completions are scored, batch 2's are not
            raise ValueError("the reward broke")
        return count_a(completion, example)

    tokenizer = make_tokenizer()
    # no checkpoint after step 1: its wait for the thread would meet the error first
    config, model = tiny_config(steps=4, async_lag=1, on_error="raise", save_every=100), make_model(len(tokenizer))
    run = resolve_run(config, task=tiny_task(count_a), rewards=[broken], model=model)
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    steps = []
    step = trainer.step
    trainer.step = lambda s: steps.append(s) or step(s)
    with pytest.raises(Exception, match="the reward broke") as raised:
        trainer.train(tmp_path / "run")
    trainer.close()
    assert steps == [1, 2]  # step 1 trained on batch 1; the error surfaced when step 2 asked for batch 2
    assert any(entry.name == "next" for entry in raised.traceback)
    assert trainer.batches.thread is None


def test_batches_restored_from_a_checkpoint_move_to_the_trainer_s_device():
    """Checkpoints load on the CPU; a batch sampled ahead goes to the device the trainer updates on, every
    tensor of it (the meta device stands in for a GPU: any tensor left behind would show)."""
    import io

    trainer = tiny_trainer(filter_groups=True, async_lag=1)
    trainer.batches.ready = {2: (sample_batch(trainer.sampling, 2), 1, {})}  # sampled ahead, not yet trained on
    saved = io.BytesIO()
    torch.save(trainer.batches.state_dict(), saved)
    saved.seek(0)
    state = torch.load(saved, map_location="cpu", weights_only=False)  # as grpo/run/checkpoint.py loads it
    trainer.batches.sampling.generation.device = torch.device("meta")
    trainer.batches.load_state_dict(state)
    seen = []

    def walk(value):
        if isinstance(value, torch.Tensor):
            seen.append(value.device.type)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                walk(getattr(value, name))
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(trainer.batches.ready[2][0])
    assert len(seen) > 10 and set(seen) == {"meta"}


def test_a_checkpoint_of_another_lag_is_refused_with_its_reason(tmp_path):
    tiny_trainer(steps=2, async_lag=1).train(tmp_path / "run")
    with pytest.raises(CheckpointError, match="sampled ahead with async_lag 1, this run has 2"):
        tiny_trainer(steps=4, async_lag=2).train(tmp_path / "run", resume=True)


def test_bad_lags_are_named():
    with pytest.raises(ConfigError, match="async_lag must be >= 0, got -1"):
        tiny_trainer(async_lag=-1)


def test_vllm_with_lora_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match="async_lag with --engine vllm and LoRA is not built"):
        tiny_trainer(async_lag=1, engine="vllm", lora_rank=4)


def test_the_synchronous_loop_has_no_thread():
    trainer = tiny_trainer(async_lag=0)
    assert isinstance(trainer.batches, EachStep) and trainer.learner.order_rng is trainer.prompt_rng
    ahead = tiny_trainer(async_lag=1)
    assert isinstance(ahead.batches, SamplingAhead) and ahead.learner.order_rng is not ahead.prompt_rng


class SlowSampler(queue.Queue):
    """The thread's jobs, for a sampler slower than the trainer: the thread takes the job of a step after
    ``first`` but starts it only once the trainer closes (the end-of-jobs mark is put), so the jobs behind
    it are still waiting then."""

    def __init__(self, first: int) -> None:
        super().__init__()
        self.first, self.closing = first, threading.Event()

    def put(self, job, block=True, timeout=None):
        if job is None:
            self.closing.set()
        super().put(job, block, timeout)

    def get(self, block=True, timeout=None):
        job = super().get(block, timeout)
        if block and job is not None and job.step > self.first:
            self.closing.wait(timeout=120)  # bounded: a run that never stops still ends
        return job


def test_an_alarm_stop_drops_the_batches_not_started_and_a_resume_samples_them_fresh(tmp_path, monkeypatch, capsys):
    """A stopping verdict after step 3 (K = 2) while the thread is on batch 4: batch 5, handed over and not
    started, is dropped; the checkpoint's batches ahead are a run of steps from 4 that next_step continues.
    Resumed, the run reaches its last step, and batch 5 samples with fresher weights, said so."""
    from grpo.observe.alarm_monitor import AlarmMonitor

    calls = []
    monkeypatch.setattr(AlarmMonitor, "stopping", lambda self: calls.append(1) or ("stall: by the test" if len(calls) == 3 else None))
    trainer = tiny_trainer(steps=8, async_lag=2, save_every=100)
    trainer.batches.jobs = SlowSampler(first=3)
    summary = trainer.train(tmp_path / "run")
    trainer.close()
    assert summary["steps"] == 3 and summary["stopped_early"] == "stall: by the test"
    state = torch.load(next((tmp_path / "run" / "checkpoints").iterdir()) / "state.pt", weights_only=False)
    ahead = state["parts"]["batches"]
    assert sorted(ahead["ready"]) == [4] and ahead["next_step"] == 5  # batch 5 was dropped, to be sampled again
    capsys.readouterr()
    monkeypatch.setattr(AlarmMonitor, "stopping", lambda self: None)
    resumed = tiny_trainer(steps=8, async_lag=2, save_every=100)
    resumed.train(tmp_path / "run", resume=True)
    resumed.close()
    lags = [r["async_lag"] for r in metrics_lines(tmp_path / "run") if "async_lag" in r]
    assert len(lags) == 8 and max(lags) <= 2
    assert lags[4] < 2  # batch 5 sampled at the resume, with the weights after step 3
    assert "batches 5-5 sample with the weights after step 3, fewer than async_lag 2 updates old" in capsys.readouterr().out
