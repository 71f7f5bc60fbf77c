"""Prompt samplers: hand-computed posteriors, preference for mixed groups, exploration, determinism, state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from grpo.config import ConfigError, TrainConfig
from grpo.math.algorithm import group_advantages, group_varies
from grpo.sampling.prompt_samplers import FrontierSampler, UniformSampler, expected_power, mixed_probability

G = 4


def _groups(*rates: float) -> torch.Tensor:
    """(len(rates), G) binary rewards with round(rate * G) successes each."""
    return torch.tensor([[1.0] * round(r * G) + [0.0] * (G - round(r * G)) for r in rates])


def test_mixed_probability_by_hand():
    # p ~ Beta(1, 1) is uniform: E[p^2] = 1/3, so a pair is mixed with chance 1 - 2/3 = 1/3 (= E[2p(1-p)])
    assert mixed_probability(np.array([1.0]), np.array([1.0]), 2)[0] == pytest.approx(1 / 3)
    # Beta(2, 1): E[p^3] = 2/3 * 3/4 * 4/5 = 2/5
    assert expected_power(np.array([2.0]), np.array([1.0]), 3)[0] == pytest.approx(2 / 5)


def test_observe_adds_successes_and_failures_to_the_posterior():
    s = FrontierSampler(10, G, seed=0, prior_strength=2.0)
    s.observe(3, [4, 7], _groups(0.75, 0.0))
    a, b = s.posterior(3)
    m = 0.5  # no exploration measured yet: the prior mean reward is one half
    assert (a[4], b[4]) == pytest.approx((2 * m + 3, 2 * (1 - m) + 1))
    assert (a[7], b[7]) == pytest.approx((2 * m + 0, 2 * (1 - m) + 4))
    assert (a[0], b[0]) == pytest.approx((1.0, 1.0))  # unseen: the prior alone
    assert s.seen_at[4] == 3 and s.seen_at[0] == -1


def test_observe_leaves_errored_rows_out_of_the_counts():
    s = FrontierSampler(10, G, seed=0, prior_strength=2.0)
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True, False], [True, True, False, False]])  # the 0s of errored rows
    s.observe(3, [4, 7], rewards, valid)
    a, b = s.posterior(3)
    assert (a[4], b[4]) == pytest.approx((1.0 + 2, 1.0 + 1))  # 2 successes, 1 failure: the errored 0 is none
    assert (a[7], b[7]) == pytest.approx((1.0 + 1, 1.0 + 1))
    assert s.trained.tolist()[4] and s.trained.tolist()[7]  # both still vary over their valid rows


def test_old_evidence_halves_every_half_life():
    s = FrontierSampler(10, G, seed=0, half_life=10.0, prior_strength=2.0)
    s.observe(0, [1], _groups(1.0))
    a_now, _ = s.posterior(0)
    a_later, _ = s.posterior(10)
    assert a_now[1] - 1.0 == pytest.approx(4.0) and a_later[1] - 1.0 == pytest.approx(2.0)
    s.observe(10, [1], _groups(0.0))  # the old 4 successes count 2 by now
    assert s.successes[1] == pytest.approx(2.0) and s.failures[1] == pytest.approx(4.0)


def _known(seed: int = 0, **kw) -> FrontierSampler:
    """100 prompts: 0-9 always solved, 10-19 never, 20-29 half the time (seen twice), 30-99 unseen."""
    s = FrontierSampler(100, G, seed=seed, **kw)
    for step in (1, 2):
        s.draw(30, step)
        s.explored = 0  # these observations are not exploration draws
        s.observe(step, list(range(30)), _groups(*[1.0] * 10, *[0.0] * 10, *[0.5] * 10))
    return s


def test_prefers_prompts_whose_groups_are_mixed():
    s = _known(explore_frac=0.0)
    drawn = s.draw(10, 3)
    assert sorted(drawn) == list(range(20, 30)) and s.explored == 0
    more = s.draw(15, 3)  # only 10 beat a uniform draw: the other 5 are explored
    assert set(range(20, 30)) <= set(more) and s.explored == 5
    assert len(set(more)) == 15


def test_exploration_rate_is_honoured_and_reaches_unseen_prompts():
    s = _known(explore_frac=0.3)
    explored, unseen = 0, 0
    for _ in range(200):
        drawn = s.draw(5, 3)  # 5 slots, 10 mixed prompts: exploitation never runs short
        explored += s.explored
        unseen += sum(i >= 30 for i in drawn)
    assert explored / 1000 == pytest.approx(0.3, abs=0.04)
    assert unseen > 0.15 * 1000  # most of the pool is unseen, so most explored draws are


def test_exclude_is_honoured():
    s = _known(explore_frac=0.5)
    drawn = s.draw(20, 3, exclude=range(20, 30))
    assert not set(drawn) & set(range(20, 30)) and len(set(drawn)) == 20


def test_same_seed_same_draws_and_state_round_trip():
    a, b = _known(seed=1), _known(seed=1)
    assert [a.draw(8, 3) for _ in range(5)] == [b.draw(8, 3) for _ in range(5)]
    assert _known(seed=2).draw(8, 3) != _known(seed=1).draw(8, 3)

    state = a.state_dict()
    c = FrontierSampler(100, G, seed=99)
    c.load_state_dict(state)
    for step in (4, 5):
        da, dc = a.draw(8, step), c.draw(8, step)
        assert da == dc
        a.observe(step, da, _groups(*[0.5] * 8))
        c.observe(step, dc, _groups(*[0.5] * 8))
    assert np.array_equal(a.successes, c.successes) and a.rng.random() == c.rng.random()
    with pytest.raises(ValueError, match="holds 100 prompts, the task has 7"):
        FrontierSampler(7, G, seed=0).load_state_dict(state)


def test_uniform_sampler_makes_the_trainers_old_draws():
    rng, reference = random.Random(5), random.Random(5)
    sampler = UniformSampler(32, rng)
    assert sampler.draw(8, 1) == [reference.randrange(32) for _ in range(8)]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("sampler", "best", "sampler must be one of uniform, frontier"),
    ("explore_frac", 1.5, "explore_frac must be in [0, 1]"),
    ("max_gen_rounds", 0, "max_gen_rounds must be positive"),
])
def test_bad_sampler_options_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        TrainConfig(**{field: value})


@pytest.mark.parametrize(("rates", "k"), [
    ([1.0, 0.5, 0.5, 0.0], 2.0),  # m = 1/2, V = 1/8: k = (1/4 - 1/8) / (1/8 - 1/16) = 2
    ([1.0, 1.0, 0.0, 0.0], 0.1),  # every prompt always or never solved: as weak as allowed
    ([0.5, 0.5, 0.5, 0.5], 100.0),  # one shared pass rate: as strong as allowed
])
def test_prior_strength_is_fitted_to_the_explored_groups(rates, k):
    s = FrontierSampler(100, G, seed=0, explore_frac=1.0)
    assert s.strength() == 2.0  # nothing explored yet: the fallback
    drawn = s.draw(len(rates), 1)
    assert s.explored == len(rates)
    s.observe(1, drawn, _groups(*rates))
    assert s.strength() == pytest.approx(k)


def test_a_fitted_weak_prior_ranks_a_once_failed_prompt_below_a_uniform_draw():
    # a pool where prompts are always or never solved: one all-wrong group is then strong evidence
    s = FrontierSampler(100, G, seed=0, explore_frac=1.0)
    drawn = s.draw(20, 1)
    s.observe(1, drawn, _groups(*[1.0] * 8, *[0.0] * 10, 0.5, 0.5))
    a, b = s.posterior(1)
    failed = drawn[8]
    assert mixed_probability(a[[failed]], b[[failed]], G)[0] < s.baseline()
    fixed = FrontierSampler(100, G, seed=0, explore_frac=1.0, prior_strength=2.0)
    fixed.observe(1, fixed.draw(20, 1), _groups(*[1.0] * 8, *[0.0] * 10, 0.5, 0.5))
    a, b = fixed.posterior(1)
    assert mixed_probability(a[[failed]], b[[failed]], G)[0] > fixed.baseline()  # what the fixed k=2 got wrong


def test_evidence_from_before_an_update_on_the_prompt_is_dropped():
    # prompt 3 was half solved (so trained on), then solved by every completion: it is no longer
    # worth a group, though its counts with the old half would still call it likely mixed
    s = FrontierSampler(10, G, seed=0, prior_strength=0.5)
    s.observe(1, [3, 4], _groups(0.5, 1.0))
    s.observe(2, [3, 4], _groups(1.0, 1.0))
    assert s.successes[3] == pytest.approx(G) and s.failures[3] == 0.0  # the mixed group's counts are gone
    decay = 0.5 ** (1 / s.half_life)  # prompt 4's first group was all correct, not trained on: it stays
    assert s.successes[4] == pytest.approx(decay * G + G)
    a, b = s.posterior(2)
    assert mixed_probability(a[[3]], b[[3]], G)[0] < 0.2
    kept = 0.5 * decay * G + G, 0.5 * decay * G  # what accumulating the counts would have left
    assert mixed_probability(np.array([0.25 + kept[0]]), np.array([0.25 + kept[1]]), G)[0] > 0.3
    state = s.state_dict()
    t = FrontierSampler(10, G, seed=0, prior_strength=0.5)
    t.load_state_dict(state)
    assert t.trained.tolist() == s.trained.tolist() and not t.trained[3]


def test_one_definition_of_a_group_that_varies_whatever_the_reward_scale():
    # a reward in [-1, 0]: the group [-1, 0, -1, 0] varies (its advantages are +-0.87, not 0);
    # clamped to [0, 1] it would read [0, 0, 0, 0], and the sampler would think it taught nothing
    rewards = torch.tensor([[-1.0, 0.0, -1.0, 0.0], [-1.0, -1.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5]])
    assert group_varies(rewards).tolist() == [True, False, False]
    assert (group_advantages(rewards.reshape(-1), 4).view(3, 4) != 0).any(dim=1).tolist() == [True, False, False]
    s = FrontierSampler(10, 4, seed=0)
    drawn = s.draw(3, step=1)
    assert s.explored == 3  # nothing seen yet: the whole draw explores, and measures the pool
    before, keep = s.pool_mixed.copy(), 0.5 ** ((1 - s.now) / s.half_life)
    s.observe(1, drawn, rewards)
    assert s.trained[drawn].tolist() == [True, False, False]
    assert s.pool_mixed - before * keep == pytest.approx([1.0, 3.0])  # one mixed group of three
