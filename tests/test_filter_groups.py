"""Dynamic sampling (filter_groups) and the frontier sampler in the trainer, on the tiny model."""

from __future__ import annotations

import pytest
import torch
from tiny_run import metrics_lines, params, tiny_trainer

import grpo.run.checkpoint as checkpoint


def even_prompts_vary(completion, example):
    """Prompts 'say a i' with even i: the first character's parity (groups mostly mixed); odd i: always 0."""
    if int(str(example["prompt"]).split()[-1]) % 2:
        return 0.0
    return float(bool(completion) and ord(completion[0]) % 2 == 0)


def never(completion, example):
    return 0.0


def test_rounds_fill_the_batch_with_informative_groups():
    trainer = tiny_trainer(reward=even_prompts_vary, prompts_per_step=8, group_size=4, filter_groups=True,
                           max_gen_rounds=4, seed=2)
    m = trainer.step(1)
    assert m["gen_rounds"] >= 2  # about half the first round's groups are constant
    assert m["generated_groups"] > 8 and m["shortfall"] == 0 and m["trained_groups"] == 8
    assert m["trained_zero_var_frac"] == 0.0 and m["zero_var_frac"] > 0.0
    assert m["adv_nonzero_frac"] > 0.5 and m["update_skipped_tokens_frac"] == 0.0
    assert m["trained_sequences"] == 8 * 4 and m["optimizer_steps"] == 1


@pytest.mark.parametrize("round_prompts, rounds", [(0, 3), (12, 2)])
def test_without_informative_groups_the_rounds_run_out_and_say_so(round_prompts, rounds):
    # B = 4, 3 rounds: 12 prompts at most. Rounds of B (the default): 4 + 4 + 4. Rounds of up to 12: the first
    # draws B (nothing seen yet), then, none having varied, the 8 still allowed at once.
    trainer = tiny_trainer(reward=never, prompts_per_step=4, filter_groups=True, max_gen_rounds=3,
                           round_prompts=round_prompts)
    before = params(trainer)
    m = trainer.step(1)
    assert m["gen_rounds"] == rounds and m["generated_groups"] == 12
    assert m["shortfall"] == 4 and m["trained_groups"] == 0 and m["optimizer_steps"] == 0
    assert m["zero_var_frac"] == 1.0 and m["zero_var_tokens_frac"] == 1.0
    after = params(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_zero_variance_compute_is_measured_without_filtering():
    trainer = tiny_trainer(reward=even_prompts_vary, prompts_per_step=8, seed=2)
    m = trainer.step(1)
    assert m["gen_rounds"] == 1 and m["trained_groups"] == 8 and m["shortfall"] == 0
    assert 0.0 < m["zero_var_frac"] < 1.0 and m["mixed_frac"] == 1.0 - m["zero_var_frac"]
    assert m["all_wrong_frac"] == m["zero_var_frac"]  # constant groups score 0 here
    assert 0.0 < m["zero_var_tokens_frac"] < 1.0
    assert m["update_skipped_tokens_frac"] == m["zero_var_tokens_frac"]  # every generated group is trained
    assert m["adv_nonzero"] == round(m["adv_nonzero_frac"] * 32)
    assert "sampler_explored_frac" not in m


def test_frontier_sampler_with_filter_groups_resumes_bitwise(tmp_path):
    kw = dict(reward=even_prompts_vary, sampler="frontier", filter_groups=True, explore_frac=0.5,
              prompts_per_step=4, seed=2)
    straight = tiny_trainer(steps=5, **kw)
    straight.train(tmp_path / "straight")
    tiny_trainer(steps=2, **kw).train(tmp_path / "split")
    resumed = tiny_trainer(steps=5, **kw)
    resumed.train(tmp_path / "split", resume=True)

    for name, value in params(straight).items():
        assert torch.equal(value, params(resumed)[name]), name
    assert metrics_lines(tmp_path / "straight") == metrics_lines(tmp_path / "split")
    assert resumed.sampler.state_dict()["seen_at"].tolist() == straight.sampler.state_dict()["seen_at"].tolist()
    assert (resumed.sampler.successes == straight.sampler.successes).all()
    saved = torch.load(checkpoint.latest(tmp_path / "split") / checkpoint.STATE, weights_only=False)
    assert "sampler" in saved["parts"]
    steps = [row for row in metrics_lines(tmp_path / "straight") if "sampler_explored_frac" in row]
    assert len(steps) == 5 and all(0.0 <= row["sampler_explored_frac"] <= 1.0 for row in steps)


def test_a_round_draws_the_missing_groups_over_the_share_expected_to_vary():
    from grpo.sampling.rounds import round_size

    assert round_size(8, None, 32, 32) == 8  # nothing seen yet: the missing groups
    assert round_size(8, 0.5, 32, 32) == 16
    assert round_size(8, 0.3, 32, 32) == 27  # 26.7, up
    assert round_size(8, 0.25, 32, 32) == 32
    assert round_size(8, 0.1, 32, 32) == 32  # one round's cap
    assert round_size(8, 0.0, 32, 24) == 24  # none varied: all the step still allows
    assert round_size(3, 0.5, 8, 32) == 6 and round_size(8, 0.5, 8, 32) == 8  # round_prompts = B: today's rounds


def test_the_first_round_is_sized_by_the_share_that_varied_in_the_steps_before():
    import math

    from grpo.sampling.prompt_samplers import SHARE_DECAY
    from grpo.sampling.rounds import sample_batch

    trainer = tiny_trainer(reward=even_prompts_vary, prompts_per_step=4, filter_groups=True, max_gen_rounds=4, seed=2,
                           round_prompts=16)
    m = trainer.step(1)
    assert trainer.draws.varied_share == pytest.approx(m["mixed_frac"])  # every group step 1 generated
    varied = round(m["mixed_frac"] * m["generated_groups"])
    assert m["surplus_groups"] == max(0, varied - 4) and (m["tokens_surplus"] > 0) == (varied > 4)
    share = trainer.draws.varied_share
    assert 0.0 < share < 1.0
    batch = sample_batch(trainer.sampling, 2)
    assert len(batch.rounds[0].prompts) == min(math.ceil(4 / share), 16)
    varied = sum(int(r.varies().sum()) for r in batch.rounds) / sum(len(r.prompts) for r in batch.rounds)
    assert trainer.draws.varied_share == pytest.approx(SHARE_DECAY * share + (1 - SHARE_DECAY) * varied)


def test_round_prompts_below_b_is_refused_once_batch_size_has_set_b():
    from grpo.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=r"^round_prompts must be 0 or at least prompts_per_step \(32\), got 16$"):
        TrainConfig(batch_size=256, group_size=8, round_prompts=16)
    assert TrainConfig(prompts_per_step=8, max_gen_rounds=3).round_cap == 8  # rounds of B by default
    assert TrainConfig(prompts_per_step=8, max_gen_rounds=3, round_prompts=24).round_cap == 24
    assert TrainConfig(prompts_per_step=8, max_gen_rounds=3, round_prompts=1000).round_cap == 24  # a step's most
    assert TrainConfig(prompts_per_step=8, round_prompts=32, filter_groups=False).round_cap == 8  # one round

