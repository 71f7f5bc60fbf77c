"""Dynamic sampling (filter_groups) and the frontier sampler in the trainer, on the tiny model."""

from __future__ import annotations

import torch
from tiny_run import metrics_lines, params, tiny_trainer

from grpo import checkpoint


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


def test_without_informative_groups_the_rounds_run_out_and_say_so():
    trainer = tiny_trainer(reward=never, prompts_per_step=4, filter_groups=True, max_gen_rounds=3)
    before = params(trainer)
    m = trainer.step(1)
    assert m["gen_rounds"] == 3 and m["generated_groups"] == 12
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
