"""Asynchronous GRPO (--async-lag K, grpo/ahead.py): the lag is exactly K, the weights each batch samples with
are those K updates old, no prompt is in flight twice, and an interrupted run resumes bitwise."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from tiny_run import metrics_lines, params, tiny_trainer

from grpo.ahead import SamplingAhead
from grpo.config import ConfigError
from grpo.interrupt import RunStopped

pytestmark = pytest.mark.equivalence


def watch(trainer):
    """Record the weights after each step and, for each batch the thread samples, the weights it loaded."""
    after = {0: params(trainer)}  # step -> the trainer's weights after its update (0: the start)
    sampled_with = {}  # step -> (version, the sampler copy's weights when it sampled that batch)
    prompts = {}  # step -> the prompts its batch drew
    step, sample = trainer.step, trainer.ahead._sample

    def stepped(s):
        out = step(s)
        after[s] = params(trainer)
        return out

    def sampled(job):
        batch, seconds = sample(job)
        copy = {n: p.detach().clone() for n, p in trainer.ahead.side.model.named_parameters()}
        sampled_with[job.step] = (job.version, copy)
        prompts[job.step] = {i for r in batch.rounds for i in r.prompts}
        return batch, seconds

    trainer.step, trainer.ahead._sample = stepped, sampled
    return after, sampled_with, prompts


@pytest.mark.parametrize("lag", [1, 2])
def test_batch_t_samples_with_the_weights_after_update_t_minus_1_minus_k(tmp_path, lag):
    trainer = tiny_trainer(steps=6, async_lag=lag)
    after, sampled_with, prompts = watch(trainer)
    trainer.train(tmp_path / "run")
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
    assert sorted(state["parts"]["ahead"]["ready"]) == [6, 7]  # sampled ahead, not yet trained on

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


def test_a_failure_in_the_sampling_thread_reaches_the_trainer(tmp_path):
    def broken(completion, example):
        raise ValueError("the reward broke")

    trainer = tiny_trainer(broken, steps=3, async_lag=1, on_error="raise")
    with pytest.raises(Exception, match="the reward broke"):
        trainer.train(tmp_path / "run")
    trainer.close()
    assert trainer.ahead.thread is None


def test_bad_lags_are_named():
    with pytest.raises(ConfigError, match="async_lag must be >= 0, got -1"):
        tiny_trainer(async_lag=-1)


def test_vllm_with_lora_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match="async_lag with --engine vllm and LoRA is not built"):
        tiny_trainer(async_lag=1, engine="vllm", lora_rank=4)


def test_the_synchronous_loop_has_no_thread():
    trainer = tiny_trainer(async_lag=0)
    assert trainer.ahead is None and trainer.order_rng is None
    assert isinstance(tiny_trainer(async_lag=1).ahead, SamplingAhead)
