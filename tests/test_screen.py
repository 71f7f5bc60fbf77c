"""Screening (grpo/sampling/screen.py): the predictor's fit, the choice of candidates, exploration, and a tiny-model run
in which the screen generates fewer zero-variance groups than the plain draw."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_run import metrics_lines, tiny_trainer

import grpo.sampling.screen as screen_module
from grpo.config import ConfigError, TrainConfig
from grpo.run.step_metrics import RunTotals
from grpo.sampling.prompt_samplers import FrontierSampler, UniformSampler
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.rounds import PROBE_STREAMS, probe_features, sample_and_score
from grpo.sampling.screen import PassRatePredictor, Screen, choose, fit_logistic, mixed_chance


def test_mixed_chance_by_hand():
    # g = 2: P(mixed) = 2 p (1 - p): 0.5 at p = 0.5; g = 8 at p = 0.5: 1 - 2 / 256
    assert mixed_chance(np.array([0.5]), 2)[0] == pytest.approx(0.5)
    assert mixed_chance(np.array([0.5]), 8)[0] == pytest.approx(1 - 2 / 256)
    assert mixed_chance(np.array([0.0, 1.0]), 8).tolist() == [0.0, 0.0]


def test_fit_logistic_recovers_two_pass_rates_by_hand():
    # x = -1 passes 10% of the time, x = +1 90%: sigmoid(b0 + b1 x) fits both when b0 = 0 and b1 = logit(0.9) = 2.197
    x = np.array([[-1.0], [1.0]])
    beta = fit_logistic(x, np.array([0.1, 0.9]), np.array([8.0, 8.0]), ridge=1e-9, iters=25)
    assert beta[0] == pytest.approx(0.0, abs=1e-6)
    assert beta[1] == pytest.approx(math.log(9.0), abs=1e-4)
    # a strong ridge pulls the slope to 0: the fit predicts the weighted mean, 0.5
    flat = fit_logistic(x, np.array([0.1, 0.9]), np.array([8.0, 8.0]), ridge=1e6)
    assert abs(flat[1]) < 1e-3 and flat[0] == pytest.approx(0.0, abs=1e-6)


def test_predictor_waits_for_both_outcomes_then_ranks_prompts():
    predictor = PassRatePredictor(seed=0)
    easy, hard = np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])
    predictor.observe(1, np.repeat(hard, 20, axis=0), np.zeros(20), np.full(20, 8.0))
    assert not predictor.ready()  # twenty all-wrong groups: nothing to rank by
    predictor.observe(1, np.repeat(easy, 20, axis=0), np.full(20, 0.5), np.full(20, 8.0))
    assert predictor.ready()
    p_easy, p_hard = predictor.predict(np.vstack([easy, hard]))
    assert p_easy > 0.3 and p_hard < 0.1
    # rows with no valid member are no evidence
    predictor.observe(2, easy, np.array([0.0]), np.array([0.0]))
    assert len(predictor.y) == 40


def test_choose_takes_the_highest_and_explores_uniformly():
    mixed = np.array([0.9, 0.1, 0.8, 0.0, 0.7, 0.2])
    rng = np.random.default_rng(0)
    exploited, explored = choose(mixed, 3, 0.0, rng)
    assert exploited == [0, 2, 4] and explored == []
    exploited, explored = choose(mixed, 4, 0.5, rng)  # 2 explored (n * 0.5 exactly), 2 the best of the rest
    assert len(explored) == 2 and len(exploited) == 2 and not set(explored) & set(exploited)
    best_rest = sorted(set(range(6)) - set(explored), key=lambda i: -mixed[i])[:2]
    assert exploited == best_rest
    assert choose(mixed, 10, 0.25, rng)[0] + choose(mixed, 10, 0.25, rng)[1] != []  # n above the candidates: all


def test_exploration_keeps_drawing_the_prompts_the_predictor_would_skip():
    # candidate 3 has P(mixed) 0: never exploited, but explored at n * explore / C per draw = 2 * 0.25 / 6
    mixed = np.array([0.9, 0.1, 0.8, 0.0, 0.7, 0.2])
    rng = np.random.default_rng(1)
    draws = [choose(mixed, 2, 0.25, rng) for _ in range(3000)]
    assert all(3 not in exploited for exploited, _ in draws)
    rate = sum(3 in explored for _, explored in draws) / len(draws)
    assert rate == pytest.approx(2 * 0.25 / 6, abs=0.02)


class FakeWorld:
    size = 1

    def broadcast_object(self, value):
        return value


class FakeTrainer:
    """What Screen.draw reads of the sampling side: the sampler, the prompts' token ids, the world."""

    def __init__(self, sampler, size: int) -> None:
        self.drawing, self.generation = SimpleNamespace(sampler=sampler), SimpleNamespace(world=FakeWorld())
        self.train_prompts = [[1] * (3 + i % 2) for i in range(size)]


def parity_features(trainer, prompts):
    return np.array([[float(i % 2), float(1 - i % 2)] for i in prompts])  # (n, 2): odd prompts, even prompts


def test_screen_prefers_prompts_that_vary_and_keeps_exploring(monkeypatch):
    monkeypatch.setattr(screen_module, "prompt_states", parity_features)
    trainer = FakeTrainer(UniformSampler(64, random.Random(0)), 64)
    screen = Screen(group_size=4, candidates=4, explore=0.25, seed=0)
    drawn, screening = screen.draw(trainer, 8, 1, (), ())
    assert len(drawn) == 8 and all(math.isnan(p) for p in screening.predicted)  # not ready: the plain draw
    odd_drawn, even_drawn = [], []
    for step in range(1, 30):
        if step > 1:
            drawn, screening = screen.draw(trainer, 8, step, (), ())
        if step > 2:  # 16 groups observed: the predictor ranks
            assert screening.screened == 32 and 0.0 <= screening.skipped_seconds <= screening.seconds
            odd_drawn.append(sum(i % 2 for i in drawn))
            even_drawn.append(sum(1 - i % 2 for i in drawn))
        # even prompts pass half the time (their groups vary), odd ones never
        rewards = torch.tensor([[float(i % 2 == 0 and k % 2 == 0) for k in range(4)] for i in drawn])
        screen.observe(step, drawn, rewards, torch.ones_like(rewards, dtype=torch.bool), rewards.std(dim=1) > 0)
    assert sum(even_drawn) > 3 * sum(odd_drawn)
    assert sum(odd_drawn) > 0  # exploration still draws the prompts predicted to give all-equal groups


def test_screen_keeps_the_frontier_samplers_uniform_draws_last():
    sampler = FrontierSampler(64, 4, seed=0, explore_frac=1.0)
    trainer = FakeTrainer(sampler, 64)
    screen = Screen(group_size=4, candidates=2, explore=0.5, seed=0)
    screen.predictor.observe(0, np.eye(2)[[0, 1] * 10], np.array([0.5, 0.0] * 10), np.full(20, 4.0))
    screen_module.prompt_states, saved = parity_features, screen_module.prompt_states
    try:
        drawn, _ = screen.draw(trainer, 8, 1, (), ())
    finally:
        screen_module.prompt_states = saved
    assert len(drawn) == 8 and sampler.explored == 4  # all 16 candidates were the sampler's uniform draws


def test_screen_config_is_checked():
    with pytest.raises(ConfigError, match="screen_explore"):
        TrainConfig(screen_explore=1.5)
    with pytest.raises(ConfigError, match="screen"):
        TrainConfig(screen=-1)
    with pytest.raises(ConfigError, match="screen_by"):
        TrainConfig(screen_by="prefix")


def test_run_totals_count_skipped_screening_as_wasted():
    totals = RunTotals()
    step = {"time_generate": 10.0, "time_generate_zero_var": 2.0, "time_screen": 2.0, "time_screen_skipped": 1.5,
            "tokens_generated": 1000.0, "tokens_zero_var": 200.0, "generated_groups": 10.0, "zero_var_frac": 0.2,
            "screen_groups": 10.0, "screen_predicted_mixed": 0.6, "screen_observed_mixed": 0.8}
    totals.add(step)
    totals.add({**step, "screen_groups": 0.0})
    out = totals.summary()
    # (2 + 1.5) x 2 wasted of (10 + 2) x 2: 7 / 24
    assert out["wasted_frac"] == pytest.approx(7 / 24) and out["seconds"] == 24.0
    assert out["zero_var_tokens_frac"] == pytest.approx(0.2) and out["zero_var_groups"] == 4
    assert out["screen_predicted_mixed"] == pytest.approx(0.6) and out["screen_observed_mixed"] == pytest.approx(0.8)


def even_prompts_vary(completion, example):
    """Prompts 'say a i' with even i: the first character's parity (groups mostly mixed); odd i: always 0."""
    if int(str(example["prompt"]).split()[-1]) % 2:
        return 0.0
    return float(bool(completion) and ord(completion[0]) % 2 == 0)


def zero_var_groups(trainer, steps: int) -> tuple[float, list[dict]]:
    records = [trainer.step(step) for step in range(1, steps + 1)]
    return sum(m["zero_var_frac"] * m["generated_groups"] for m in records[1:]), records


@pytest.mark.model
@pytest.mark.parametrize("by", ["state", "probe"])
def test_screened_run_generates_fewer_zero_variance_groups_on_the_tiny_model(by):
    kw = dict(reward=even_prompts_vary, prompts_per_step=8, group_size=4, filter_groups=True, max_gen_rounds=4,
              seed=2)
    plain, _ = zero_var_groups(tiny_trainer(**kw), 5)
    screened, records = zero_var_groups(tiny_trainer(screen=4, screen_by=by, **kw), 5)
    assert screened < 0.6 * plain, (screened, plain)
    ranked = [m for m in records if "screen_predicted_mixed" in m]
    assert ranked and all(0.0 <= m["screen_predicted_mixed"] <= 1.0 for m in ranked)
    assert all(m["time_screen"] > 0.0 and 0.0 <= m["generate_wasted_frac"] <= 1.0 for m in records)


def test_probe_streams_never_meet_the_groups_streams():
    # a probe completion and a group's completion of the same step and round draw from different streams:
    # the probe is not a member of any group in disguise
    for step, index in ((1, 0), (3, 2)):
        groups = stream_keys(7, step, index, torch.arange(4096))
        probes = stream_keys(7, step, index, torch.arange(4096), PROBE_STREAMS)
        assert not {tuple(k) for k in groups.tolist()} & {tuple(k) for k in probes.tolist()}


def test_probe_screen_learns_which_way_the_probability_points(monkeypatch):
    # every probe scores 0 (the reward tells nothing); groups vary where the probe's completion was unlikely
    # (q = 0.2: odd prompts), never where it was likely (q = 0.95): the screen learns to prefer unlikely probes
    trainer = FakeTrainer(UniformSampler(64, random.Random(0)), 64)
    screen = Screen(group_size=4, candidates=4, explore=0.25, seed=0, by="probe")

    def featurize(candidates):
        q = np.array([0.2 if i % 2 else 0.95 for i in candidates])
        return np.stack([q, q, np.zeros_like(q), np.zeros_like(q), np.zeros_like(q)], 1), 1.0, np.ones(len(q))

    odd = even = 0
    for step in range(1, 20):
        drawn, screening = screen.draw(trainer, 8, step, (), (), featurize)
        if step > 2:
            odd, even = odd + sum(i % 2 for i in drawn), even + sum(1 - i % 2 for i in drawn)
            assert screening.skipped_seconds == pytest.approx(0.75)  # 24 of 32 equal-cost probes skipped
        varies = torch.tensor([bool(i % 2) for i in drawn])
        rewards = torch.stack([torch.tensor([0.0, 1.0, 0.0, 0.0]) if v else torch.zeros(4) for v in varies])
        screen.observe(step, drawn, rewards, torch.ones_like(rewards, dtype=torch.bool), varies)
    assert odd > 3 * even and even > 0  # exploration still draws the likely ones


@pytest.mark.model
def test_probe_features_by_hand():
    trainer = tiny_trainer(reward=even_prompts_vary, prompts_per_step=4, group_size=4, screen=2, screen_by="probe")
    sampling = trainer.sampling
    x, seconds, cost = probe_features(sampling, [4, 5, 6], 1, 0)
    # one completion per candidate, sampled from the probe's streams: its features from its log-probs and reward
    keys = stream_keys(sampling.config.seed, 1, 0, torch.arange(3), PROBE_STREAMS)
    rollout, rewards, _, _ = sample_and_score(sampling, [4, 5, 6], streams=keys, group_size=1)
    assert x.shape == (3, 5) and seconds > 0.0 and cost.tolist() == rollout.lengths.clamp(min=1).tolist()
    q = [math.exp(sum(row[:n].tolist())) for row, n in zip(rollout.logprobs, rollout.lengths, strict=True)]
    assert x[:, 0] == pytest.approx(q, rel=1e-5) and (x[:, 0] < 1.0).all()
    least = [math.exp(min(row[:n].tolist())) for row, n in zip(rollout.logprobs, rollout.lengths, strict=True)]
    assert x[:, 1] == pytest.approx(least, rel=1e-5) and (x[:, 1] >= x[:, 0] - 1e-7).all()
    assert x[:, 2].tolist() == rewards.clamp(0, 1).tolist() and x[:, 3] == pytest.approx(x[:, 0] * x[:, 2])
    assert x[:, 4].tolist() == rollout.truncated.float().tolist()


def test_a_screen_resumes_only_with_the_features_it_saved():
    state = Screen(group_size=4, candidates=2, explore=0.25, seed=0, by="state").state_dict()
    with pytest.raises(ValueError, match="screen_by is 'probe'"):
        Screen(group_size=4, candidates=2, explore=0.25, seed=0, by="probe").load_state_dict(state)


@pytest.mark.model
@pytest.mark.parametrize("by", ["state", "probe"])
def test_screened_run_resumes_bitwise(tmp_path, by):
    # the screen's fitted data and random stream are in the checkpoint: a run stopped after 2 of 4 steps and
    # resumed draws, trains and logs exactly as the straight run
    kw = dict(reward=even_prompts_vary, prompts_per_step=8, group_size=4, filter_groups=True, seed=2, screen=2,
              screen_by=by)
    straight = tiny_trainer(steps=4, **kw)
    straight.train(tmp_path / "straight")
    tiny_trainer(steps=2, **kw).train(tmp_path / "split")
    resumed = tiny_trainer(steps=4, **kw)
    resumed.train(tmp_path / "split", resume=True)
    assert metrics_lines(tmp_path / "straight") == metrics_lines(tmp_path / "split")
    assert np.array_equal(resumed.screen.predictor.y, straight.screen.predictor.y)
    assert any("screen_predicted_mixed" in row for row in metrics_lines(tmp_path / "straight"))
