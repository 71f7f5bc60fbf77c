"""The objective menu in training: a tiny model's step under each objective and estimator, and (slow)
the embedded model learning `add` under each objective at its recommended settings."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_run import tiny_trainer

import grpo.trainer
from grpo.config import TrainConfig

OBJECTIVES = ("ppo", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl")


def parity(completion, example):
    """1 when the last character's code is even: groups that mix 0s and 1s, with ties at the top."""
    return float(bool(completion) and ord(completion[-1]) % 2 == 0)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_each_objective_trains_a_tiny_model(objective):
    trainer = tiny_trainer(reward=parity, objective=objective, epochs=2, steps=1)  # mu = 2: the ratio moves
    before = [p.detach().clone() for p in trainer.model.parameters()]
    m = trainer.step(1)
    assert m["optimizer_steps"] == 2 and m["nonfinite_skipped"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert trainer.config.clip_low == TrainConfig(objective=objective).clip_low  # the recommended value


@pytest.mark.parametrize("estimator", ("passk", "rloo", "reinforce_pp_baseline"))
def test_dynamic_sampling_trains_only_groups_that_teach_under_the_estimator(estimator, monkeypatch):
    trainer = tiny_trainer(reward=parity, advantage_estimator=estimator, prompts_per_step=6, seed=5,
                           filter_groups=True, max_gen_rounds=3, steps=1)
    seen = []
    update = grpo.trainer.update
    monkeypatch.setattr(grpo.trainer, "update", lambda learner, rollout, adv, ref, lengths:
                        seen.append(adv.clone()) or update(learner, rollout, adv, ref, lengths))
    m = trainer.step(1)
    grouped = seen[0].view(-1, 4)
    # pass@k: a group [1, 1, 0, 0] varies but its advantages are all zero; it must not fill the batch
    assert (grouped != 0).any(dim=1).all()
    assert m["trained_zero_var_frac"] == 0.0


def test_reinforce_pp_trains_a_step_with_a_batch_baseline(monkeypatch):
    trainer = tiny_trainer(reward=parity, advantage_estimator="reinforce_pp", steps=1)
    seen = []
    update = grpo.trainer.update
    monkeypatch.setattr(grpo.trainer, "update", lambda learner, rollout, adv, ref, lengths:
                        seen.append((adv.clone(), lengths.clone())) or update(learner, rollout, adv, ref, lengths))
    trainer.step(1)
    adv, lengths = seen[0]
    weight = lengths.float()
    assert abs(float((adv * weight).sum() / weight.sum())) < 1e-5  # whitened over the batch's tokens


def test_a_step_reports_the_shares_of_tokens_and_completions_masked():
    # the own sampler's ratio is 1 up to rounding: a geometric mask on [1.5, 2] leaves every completion out
    m = tiny_trainer(tis_mode="mask", tis_level="sequence", tis_low=1.5, tis_cap=2.0, steps=1).step(1)
    assert (m["tis_masked_tokens"], m["tis_masked_sequences"]) == (1.0, 1.0)
    m = tiny_trainer(tis_mode="mask", tis_level="token", tis_low=0.5, tis_cap=2.0, steps=1).step(1)
    assert (m["tis_masked_tokens"], m["tis_masked_sequences"]) == (0.0, 0.0)


ADD_STEPS, ADD_EVAL = 10, 64


RUNS = [{"objective": o} for o in OBJECTIVES] + [
    {"advantage_estimator": e} for e in ("rloo", "reinforce_pp", "reinforce_pp_baseline", "passk")]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GRPO_OBJECTIVE_RUNS"),
                    reason="ten 10-step add runs on the embedded model take tens of minutes: GRPO_OBJECTIVE_RUNS=1 runs them")
@pytest.mark.parametrize("setting", RUNS, ids=lambda d: next(iter(d.values())))
def test_each_objective_and_estimator_raises_held_out_accuracy_on_add(setting, tmp_path):
    """10 steps on `add` at each objective's recommended settings, and under each estimator, raise held-out greedy
    accuracy by 15 points (opt-in, not in CI: tens of minutes; measured 2026-12-03: the objectives +43.8 to +54.7
    points, the four estimators +45.3 to +48.4, docs/objectives.md)."""
    from grpo import train

    name = next(iter(setting.values()))
    result = train(TrainConfig(task="add", steps=ADD_STEPS, eval_size=ADD_EVAL, eval_every=-1, **setting,
                               output=str(tmp_path / name), save_model=False, preflight="off", seed=0))
    gain = result["heldout_accuracy_end"] - result["heldout_accuracy_start"]
    assert gain >= 0.15, (setting, result["heldout_accuracy_start"], result["heldout_accuracy_end"])
