"""The objective menu in training: a tiny model's step under each objective and estimator, and (slow)
the embedded model learning `add` under each objective at its recommended settings."""

from __future__ import annotations

import math
import os
import statistics

import pytest
import torch
from tiny_run import tiny_trainer

import grpo.run.trainer
from grpo.config import TrainConfig
from grpo.learning.update import trainer_logprobs

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


# each objective's recommended (clip_low, clip_high, aggregate), written out: grpo/config.py RECOMMENDED
# and the defaulting that applies it are both under test
LITERAL = {"ppo": (0.2, 0.28, "token"), "cispo": (1.0, 4.0, "token"), "sapo": (0.2, 0.28, "sequence"),
           "gmpo": (0.4, 0.4, "sequence"), "dppo_tv": (0.15, 0.15, "token"), "dppo_kl": (0.05, 0.05, "token")}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_trainer_takes_the_objectives_recommended_clip_values(objective):
    cfg = tiny_trainer(objective=objective, steps=1).draft
    assert (cfg.clip_low, cfg.clip_high, cfg.aggregate) == LITERAL[objective]


def step_logprob_change(monkeypatch, **settings) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One real trainer step (mu = 2: the second pass off-policy) with the parity reward: each completion's
    advantage, the change of its log-probability (summed over its tokens) across the step, the step's
    metrics and the parameters after it."""
    trainer = tiny_trainer(reward=parity, epochs=2, steps=1, seed=1, **settings)
    seen = {}
    update = grpo.run.trainer.update

    def spy(learner, rollout, adv, ref, lengths):
        before = (trainer_logprobs(learner, rollout) * rollout.mask).sum(dim=1)  # (N,)
        stats = update(learner, rollout, adv, ref, lengths)
        seen["change"] = (trainer_logprobs(learner, rollout) * rollout.mask).sum(dim=1) - before
        seen["adv"] = adv.clone()
        return stats

    monkeypatch.setattr(grpo.run.trainer, "update", spy)
    m = trainer.step(1)
    return seen["adv"], seen["change"], m, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_each_objective_raises_the_positive_completions_and_lowers_the_negative_ones(objective, monkeypatch):
    # at its recommended settings: a sign flipped in the objective moves each completion against its advantage
    adv, change, _, _ = step_logprob_change(monkeypatch, objective=objective)
    assert (adv > 0).sum() >= 2 and (adv < 0).sum() >= 2
    assert change[adv > 0].mean() > 0, change[adv > 0]
    assert change[adv < 0].mean() < 0, change[adv < 0]
    assert float((adv * change).sum()) > 0


def test_the_objectives_give_different_updates_on_the_same_batch(monkeypatch):
    # On policy, at ratio 1, ppo, cispo and dppo share one gradient, A grad log pi, and at their recommended
    # bounds the second pass's ratios of a tiny model rarely reach them. With bounds of 1e-4 each objective's
    # clip or trust region acts on the second pass (each reports clipped tokens; sapo has none, and gmpo
    # its sequence aggregation): an option read but another objective's loss used makes two updates equal.
    after = {}
    for objective in OBJECTIVES:
        _, _, m, after[objective] = step_logprob_change(monkeypatch, objective=objective, clip_low=1e-4,
                                                        clip_high=1e-4)
        assert objective == "sapo" or m["clip_frac_low"] + m["clip_frac_high"] > 0, objective
    for i, a in enumerate(OBJECTIVES):
        for b in OBJECTIVES[i + 1:]:
            gap = max(float((after[a][n] - after[b][n]).abs().max()) for n in after[a])
            assert gap > 1e-4, f"{a} and {b} made the same update"


@pytest.mark.parametrize("estimator", ("passk", "rloo", "reinforce_pp_baseline"))
def test_dynamic_sampling_trains_only_groups_that_teach_under_the_estimator(estimator, monkeypatch):
    trainer = tiny_trainer(reward=parity, advantage_estimator=estimator, prompts_per_step=6, seed=5,
                           filter_groups=True, max_gen_rounds=3, steps=1)
    seen = []
    update = grpo.run.trainer.update
    monkeypatch.setattr(grpo.run.trainer, "update", lambda learner, rollout, adv, ref, lengths:
                        seen.append(adv.clone()) or update(learner, rollout, adv, ref, lengths))
    m = trainer.step(1)
    grouped = seen[0].view(-1, 4)
    # pass@k: a group [1, 1, 0, 0] varies but its advantages are all zero; it must not fill the batch
    assert (grouped != 0).any(dim=1).all()
    assert m["trained_zero_var_frac"] == 0.0


def fifths(completion, example):
    """The character codes' sum mod 5, over 4: five reward levels, so groups with ties, spreads and, now
    and then, one value throughout."""
    return sum(map(ord, completion)) % 5 / 4


def by_hand(estimator: str, rewards: list[float], lengths: list[int], g: int) -> list[float]:
    """Each estimator's advantages from its formula (grpo/math/algorithm.py group_advantages), one group at a
    time in plain Python: the trainer's must match them."""
    groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
    if estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        x = rewards if estimator == "reinforce_pp" else [r - statistics.fmean(grp) for grp in groups for r in grp]
        n = sum(lengths)  # every token counts: mu and the unbiased variance over the batch's tokens
        mu = sum(v * w for v, w in zip(x, lengths, strict=True)) / n
        var = sum(w * (v - mu) ** 2 for v, w in zip(x, lengths, strict=True)) / (n - 1)
        return [(v - mu) / math.sqrt(var + 1e-8) if w else 0.0 for v, w in zip(x, lengths, strict=True)]
    out = []
    for grp in groups:
        mean, sd = statistics.fmean(grp), statistics.stdev(grp)
        if estimator == "grpo":
            out += [(r - mean) / (sd + 1e-6) for r in grp]
        elif estimator == "rloo":
            out += [r - (sum(grp) - r) / (g - 1) for r in grp]
        else:  # passk: the best member alone, by its margin over the second, over the group's std
            best, second = sorted(grp, reverse=True)[:2]
            out += [0.0] * g
            out[len(out) - g + grp.index(best)] = (best - second) / (sd + 1e-6)
    return out


@pytest.mark.parametrize("estimator", ("grpo", "rloo", "passk", "reinforce_pp", "reinforce_pp_baseline"))
def test_the_trainer_trains_on_each_estimators_advantages(estimator, monkeypatch):
    trainer = tiny_trainer(reward=fifths, advantage_estimator=estimator, prompts_per_step=6, steps=1, seed=2)
    seen = []
    update = grpo.run.trainer.update
    monkeypatch.setattr(grpo.run.trainer, "update", lambda learner, rollout, adv, ref, lengths:
                        seen.append((rollout.texts, adv.clone(), lengths.tolist()))
                        or update(learner, rollout, adv, ref, lengths))
    trainer.step(1)
    texts, adv, lengths = seen[0]
    rewards = [fifths(t, None) for t in texts]  # scored again here, from the completions the update saw
    assert len(set(rewards)) >= 3 and len(set(lengths)) >= 2  # the formulas' terms all matter on this batch
    expected = torch.tensor(by_hand(estimator, rewards, lengths, 4))
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


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


def test_reinforce_pp_baseline_trains_its_all_equal_groups_and_the_metrics_say_so(monkeypatch):
    # verl's numbers: an all-equal group's advantages are the batch's shift, not zero (where completions'
    # lengths differ: with equal ones the token mean of the centred rewards is 0); with no dynamic sampling
    # they train, so the update skips none of them though they count as zero-variance groups
    trainer = tiny_trainer(reward=parity, advantage_estimator="reinforce_pp_baseline", prompts_per_step=6,
                           seed=4, steps=1)
    seen = []
    update = grpo.run.trainer.update
    monkeypatch.setattr(grpo.run.trainer, "update", lambda learner, rollout, adv, ref, lengths:
                        seen.append((rollout.texts, adv.clone())) or update(learner, rollout, adv, ref, lengths))
    m = trainer.step(1)
    texts, adv = seen[0]
    rewards = torch.tensor([parity(t, None) for t in texts]).view(-1, 4)
    equal = (rewards == rewards[:, :1]).all(dim=1)  # (B,)
    assert 0 < int(equal.sum()) < len(equal)
    assert (adv.view(-1, 4)[equal] != 0).all()
    assert m["trained_zero_var_frac"] == pytest.approx(float(equal.float().mean()))
    assert m["update_skipped_tokens_frac"] == 0.0
