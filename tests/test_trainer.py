"""Tiny-model runs of the whole loop that assert outcomes."""

from pathlib import Path

import pytest
import torch

from grpo.config import TrainConfig
from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.tasks import Task


def count_a(completion, example):
    """Reward: the share of characters that are 'a' (a tiny model learns this in a few steps)."""
    return completion.count("a") / max(len(completion), 1)


def starts_with_a(completion, example):
    return float(completion.startswith("a"))


def _task(reward=count_a):
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    return Task("tiny", rows[:32], rows[32:], reward)


def _config(**kw):
    base = dict(preflight="off", eval_every=-1, temperature=1.0, sampler="uniform", filter_groups=False, steps=2, prompts_per_step=4, group_size=4, max_new_tokens=6, lr=1e-2, warmup_steps=0,
                eval_size=8, sample_every=0, device="cpu", save_model=False)
    return TrainConfig(**{**base, **kw})


def _trainer(model, tokenizer, reward=count_a, **kw):
    config = _config(**kw)
    setup_process(config)
    return GRPOTrainer(resolve_run(config, task=_task(reward), model=model), model=model, tokenizer=tokenizer,
                       progress=False)


def test_two_steps_change_the_parameters(tiny_model, tokenizer, tmp_path):
    before = [p.detach().clone() for p in tiny_model.parameters()]
    trainer = _trainer(tiny_model, tokenizer)
    summary = trainer.train(tmp_path / "run")
    changed = sum(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters(), strict=False))
    assert changed == len(before)
    assert summary["steps"] == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4  # the first evaluation, two steps and the final evaluation


def test_reward_rises_on_a_learnable_reward(tiny_model, tokenizer):
    trainer = _trainer(tiny_model, tokenizer, steps=30, prompts_per_step=8, group_size=8, lr=1e-2)
    rewards = [trainer.step(s)["reward_mean"] for s in range(1, 31)]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards


def _record_gradients(trainer):
    """The gradients each optimiser step is given (after clipping), in parameter order. Compared rather
    than the parameters after the step: AdamW's first step moves every parameter by about lr whatever the
    size of its gradient, so two first steps can agree while their gradients do not."""
    seen, step = [], trainer.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                     for p in trainer.model.parameters()])
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    return seen


def _gradients_of_one_step(tokenizer, **kw):
    from conftest import make_model

    trainer = _trainer(make_model(len(tokenizer), seed=3), tokenizer, seed=5, **kw)
    seen = _record_gradients(trainer)
    trainer.step(1)
    assert len(seen) == 1, "one optimiser step"
    return seen[0]


def assert_same_gradients(a, b, rel=1e-5):
    """Equal to float summation order: the difference's norm within ``rel`` of the gradient's, and a
    gradient that is not zero (two zero gradients would agree about nothing)."""
    flat_a, flat_b = torch.cat([g.flatten() for g in a]), torch.cat([g.flatten() for g in b])
    norm = flat_a.norm().item()
    assert norm > 0, "the step had no gradient"
    assert (flat_a - flat_b).norm().item() <= rel * norm, (flat_a - flat_b).norm().item() / norm


@pytest.mark.parametrize("aggregate", ["token", "sequence", "fixed"])
def test_micro_batches_give_the_same_update_as_one_batch(tokenizer, aggregate):
    # first_char_parity splits the groups of random completions (count_a's reward is 0 on them all at this
    # seed: no gradient, no step, and two unmoved models that agree about nothing); stop characters make
    # the lengths differ, without which the three aggregates give one gradient
    kw = dict(aggregate=aggregate, reward=first_char_parity, stop=tuple("abcdefgh"))
    whole = _gradients_of_one_step(tokenizer, micro_batch_tokens=100_000, **kw)
    split = _gradients_of_one_step(tokenizer, micro_batch_tokens=1, **kw)  # a completion each
    assert_same_gradients(whole, split)


def test_micro_batches_split_a_group_over_the_budget_into_parts_of_its_rows():
    from types import SimpleNamespace

    from grpo.learning.update import micro_batches

    # 3 groups of 4: prompts of 5 tokens, longest completions 10, 2 and 3 tokens: costs 45, 13 and 17
    mask = torch.zeros(12, 10)
    for row, n in enumerate([10, 4, 4, 4, 2, 2, 2, 2, 3, 1, 1, 1]):
        mask[row, :n] = 1.0
    rollout = SimpleNamespace(lengths=mask.sum(dim=1).long(), prompt_ids=[[1] * 5] * 3)
    cfg = TrainConfig(group_size=4, micro_batch_tokens=30)
    plan = [(m.groups.tolist(), m.start, m.stop) for m in micro_batches(cfg, rollout, torch.arange(3))]
    # group 0 alone is over 30: parts of (30 - 5) // 10 = 2 rows; groups 2 and 1 share one (17 + 13 = 30)
    assert plan == [([0], 0, 2), ([0], 2, 4), ([2, 1], 0, 0)]
    assert micro_batches(cfg, rollout, torch.arange(3))[1].rows(4).tolist() == [2, 3]


@pytest.mark.parametrize("kw", [dict(epochs=2, minibatches=2), dict(beta=0.1)], ids=["off-policy", "kl"])
def test_parts_of_groups_give_the_update_of_whole_groups(tokenizer, kw):
    # pi_old (off-policy: the pre-pass, indexed by row), the reference's log-probs and the advantages are
    # read at each part's own rows; a part runs its prompt again, and the gradients add up the same
    kw = dict(kw, reward=first_char_parity, stop=tuple("abcdefgh"))
    from conftest import make_model

    results = []
    for budget in (100_000, 1):
        trainer = _trainer(make_model(len(tokenizer), seed=3), tokenizer, seed=5, micro_batch_tokens=budget, **kw)
        seen = _record_gradients(trainer)
        m = trainer.step(1)
        results.append((seen, m))
    (whole, m_whole), (split, m_split) = results
    assert len(whole) == len(split) >= 1
    for a, b in zip(whole, split, strict=True):
        assert_same_gradients(a, b)
    assert m_split["trained_sequences"] == m_whole["trained_sequences"]


def test_skipping_zero_advantage_groups_leaves_the_update_unchanged(tokenizer):
    # starts_with_a gives many all-zero groups alongside informative ones
    kw = dict(prompts_per_step=8, group_size=4, max_new_tokens=3)
    from conftest import make_model

    results = []
    for skip in (True, False):
        model = make_model(len(tokenizer), seed=3)
        trainer = _trainer(model, tokenizer, reward=starts_with_a, seed=11, skip_zero_advantage=skip, **kw)
        with torch.no_grad():  # bias the first token towards 'a' so some groups are mixed
            model.lm_head.weight[tokenizer.convert_tokens_to_ids("a")] *= 0.0
        seen = _record_gradients(trainer)
        m = trainer.step(1)
        results.append((seen[0], m))
    (g_skip, m_skip), (g_full, m_full) = results
    assert m_skip["trained_sequences"] < m_full["trained_sequences"]
    assert 0 < m_skip["trained_sequences"]
    assert_same_gradients(g_skip, g_full)


def first_char_parity(completion, example):
    """A reward that splits almost every group of random completions (so every step has signal)."""
    return float(ord(completion[0]) % 2) if completion else 0.5


def test_lora_and_kl_reference_run(tiny_model, tokenizer):
    trainer = _trainer(tiny_model, tokenizer, reward=first_char_parity, lora_rank=4, beta=0.1)
    m = trainer.step(1)
    assert m["optimizer_steps"] == 1 and m["adv_nonzero_frac"] > 0
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference
    m = trainer.step(2)
    assert m["kl"] > 0.0
    full = _trainer(tiny_model, tokenizer, reward=first_char_parity, beta=0.1, epochs=2, minibatches=2)
    m = full.step(1)
    assert m["optimizer_steps"] == 4


def test_own_engine_fp32_tis_weights_are_one(tokenizer):
    # the own engine samples with the weights the trainer recomputes with, in fp32: the sampler's and the
    # trainer's log-probs agree to float rounding (about 1e-6), so every TIS weight is 1, none is capped;
    # off-policy, pi_old is the pass before the first optimiser step, so the weights are 1 there too
    from conftest import make_model

    for kw in ({}, {"epochs": 2, "minibatches": 2}):  # on-policy (detached logp), off-policy (the pre-pass)
        trainer = _trainer(make_model(len(tokenizer), seed=3), tokenizer, reward=first_char_parity, **kw)
        m = trainer.step(1)
        assert m["optimizer_steps"] >= 1
        assert m["sampler_logp_diff"] <= m["sampler_logp_diff_max"] < 1e-5 and m["sampler_kl"] < 1e-9, m
        assert m["tis_capped_frac"] == 0.0
        if not kw:  # on-policy the ratio is exactly 1; off-policy it moves with the minibatches' steps
            assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_tis_with_the_own_engine_gives_the_update_without_it(tokenizer):
    # weights of 1 to float rounding: the update with TIS is the update without it, to rounding
    with_tis = _gradients_of_one_step(tokenizer, reward=first_char_parity)
    without = _gradients_of_one_step(tokenizer, reward=first_char_parity, tis_cap=0.0)
    assert_same_gradients(with_tis, without)


def test_gradient_checkpointing_gives_the_update_without_it(tokenizer):
    # each decoder layer run again in backward, with its cache slot put back: the same gradient, to rounding
    kw = dict(reward=first_char_parity, stop=tuple("abcdefgh"))
    with_it = _gradients_of_one_step(tokenizer, gradient_checkpointing=True, **kw)
    assert_same_gradients(with_it, _gradients_of_one_step(tokenizer, **kw))


@pytest.mark.unit  # a tiny model, seconds: make mutants runs it for the update's normalisers
@pytest.mark.parametrize("aggregate", ["token", "sequence"])
def test_each_minibatch_is_normalised_by_its_own_tokens_and_sequences(tokenizer, monkeypatch, aggregate):
    # two minibatches, some completions cut and masked whole (mask_truncated): each optimiser step's loss
    # divides by the policy tokens and the sequences with tokens of that minibatch alone
    import grpo.learning.update

    calls, loss = [], grpo.learning.update.policy_loss

    def recording_loss(logp, old_logp, adv, mask, **kw):
        calls.append((float(mask.sum()), int((mask.sum(dim=1) > 0).sum()), kw["total_tokens"], kw["total_sequences"]))
        return loss(logp, old_logp, adv, mask, **kw)

    monkeypatch.setattr(grpo.learning.update, "policy_loss", recording_loss)
    from conftest import make_model

    trainer = _trainer(make_model(len(tokenizer), seed=3), tokenizer, seed=5, reward=first_char_parity,
                       stop=tuple("abcdefgh"), minibatches=2, micro_batch_tokens=1, mask_truncated=True,
                       max_new_tokens=12, aggregate=aggregate,  # 8 of 16 cut at 12 tokens
                       skip_zero_advantage=False)  # every group runs (a skipped one still counts, by design)
    steps = _record_gradients(trainer)
    m = trainer.step(1)
    assert len(steps) == m["optimizer_steps"] == 2 and m["errored/truncated"] > 0
    by_minibatch = {}
    for tokens, sequences, total_tokens, total_sequences in calls:
        seen = by_minibatch.setdefault((total_tokens, total_sequences), [0.0, 0])
        seen[0] += tokens
        seen[1] += sequences
    assert len(by_minibatch) == 2, by_minibatch
    for (total_tokens, total_sequences), (tokens, sequences) in by_minibatch.items():
        assert (total_tokens, total_sequences) == (tokens, sequences)


def test_a_runs_default_folder_is_named_after_its_data_file_or_its_task():
    from grpo.run.trainer import default_run_dir

    assert default_run_dir(TrainConfig(data="/tmp/my rows.jsonl")).name.endswith("-my-rows")
    assert default_run_dir(TrainConfig(data="rows/")).name.endswith("-rows")
    assert default_run_dir(TrainConfig(task="countdown")).name.endswith("-countdown")
    assert default_run_dir(TrainConfig(output="here")) == Path("here")
