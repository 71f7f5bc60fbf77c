"""One policy for rows that errored (grpo/sampling/rounds.py): a reward call that failed, an environment that raised,
a completion cut at the limit under mask_truncated. Each leaves the loss and its group's statistics, and is
counted by cause; only the model's own failures score 0 and are trained on."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from tiny_run import tiny_trainer

import grpo.run.trainer
from grpo.math.algorithm import group_advantages


def odd_first_char_raises(completion, example):
    """Raises (a checker bug) when the completion starts with an odd character; else the parity of its last."""
    if completion and ord(completion[0]) % 2:
        raise ValueError("checker cannot parse this")
    return float(bool(completion) and ord(completion[-1]) % 2 == 0)


def _spy(trainer, monkeypatch):
    """What the update is given, and the rewards the scorer returned, step by step."""
    seen = {"update": [], "scores": []}
    update, score = grpo.run.trainer.update, trainer.sampling.scoring.score

    def spy_update(learner, rollout, advantages, ref_logp, lengths):
        seen["update"].append((rollout.mask.clone(), advantages.clone(), lengths.clone(),
                               rollout.truncated.clone()))
        return update(learner, rollout, advantages, ref_logp, lengths)

    def spy_score(texts, *args, **kwargs):
        rewards, metrics = score(texts, *args, **kwargs)
        seen["scores"].append((rewards.clone(), list(texts)))
        return rewards, metrics

    monkeypatch.setattr(grpo.run.trainer, "update", spy_update)
    trainer.sampling.scoring.score = spy_score
    return seen


def test_rows_whose_reward_call_failed_leave_the_loss_and_their_groups_statistics(monkeypatch):
    trainer = tiny_trainer(reward=odd_first_char_raises, prompts_per_step=6, group_size=4, seed=5)
    seen = _spy(trainer, monkeypatch)
    m = trainer.step(1)
    scored, texts = seen["scores"][0]  # (24,) NaN where the call failed
    errored = torch.tensor([bool(t) and ord(t[0]) % 2 == 1 for t in texts])  # where the checker raised
    assert 0 < int(errored.sum()) < 24, "the seed should give some failures and some verdicts"
    mask, advantages, lengths, _ = seen["update"][0]
    # the errored rows: no token in the loss, no tokens in its normaliser, no advantage
    assert mask[errored].sum() == 0 and lengths[errored].sum() == 0 and advantages[errored].abs().sum() == 0
    # the others: advantages over their group's valid rows alone (a group of fewer than two: none)
    valid = ~errored & ((~errored).view(-1, 4).sum(dim=1, keepdim=True) >= 2).expand(-1, 4).reshape(-1)
    expected = group_advantages(torch.where(errored, 0.0, scored), 4, valid=valid)
    torch.testing.assert_close(advantages, expected)
    assert torch.equal(mask[valid].sum(dim=1) > 0, torch.ones(int(valid.sum()), dtype=torch.bool))
    # counted by cause, and the raw reward is that of the rows with a verdict
    assert m["errored/reward"] == int(errored.sum()) and m["errored/environment"] == 0 == m["errored/truncated"]
    assert m["errored_frac"] == errored.float().mean().item()
    assert math.isclose(m["reward_mean"], scored[~errored].mean().item(), rel_tol=1e-6)
    assert scored[errored].isnan().all()  # the scorer's mark: no verdict


def test_cut_completions_under_mask_truncated_are_errored_rows(monkeypatch):
    # stops on any of a-h: about half the completions end within 8 tokens, half are cut
    trainer = tiny_trainer(prompts_per_step=8, group_size=4, max_new_tokens=8, stop=tuple("abcdefgh"),
                           mask_truncated=True, seed=0)
    seen = _spy(trainer, monkeypatch)
    m = trainer.step(1)
    mask, advantages, lengths, cut = seen["update"][0]
    scored, _ = seen["scores"][0]
    assert cut.any() and (~cut).any() and m["errored/truncated"] == int(cut.sum())
    assert mask[cut].sum() == 0 and advantages[cut].abs().sum() == 0 and lengths[cut].sum() == 0
    # the uncut rows' advantages are standardised over the uncut rows of their group alone
    valid = ~cut & ((~cut).view(-1, 4).sum(dim=1, keepdim=True) >= 2).expand(-1, 4).reshape(-1)
    torch.testing.assert_close(advantages, group_advantages(scored, 4, valid=valid))
    with_cut = group_advantages(scored, 4)
    assert not torch.allclose(advantages[valid], with_cut[valid])  # not what counting the cut rows gives


def test_dynamic_sampling_does_not_count_a_group_that_varies_only_through_errored_rows(monkeypatch):
    trainer = tiny_trainer(reward=odd_first_char_raises, prompts_per_step=6, group_size=4, seed=5,
                           filter_groups=True, max_gen_rounds=3)
    seen = _spy(trainer, monkeypatch)
    m = trainer.step(1)
    _, advantages, _, _ = seen["update"][0]
    assert m["trained_zero_var_frac"] == 0.0
    assert (advantages.view(-1, 4) != 0).any(dim=1).all()  # every trained group has a signal among valid rows


def test_reward_errors_count_rows_over_every_round_as_errored_does(monkeypatch):
    trainer = tiny_trainer(reward=odd_first_char_raises, prompts_per_step=6, group_size=4, seed=5,
                           filter_groups=True, max_gen_rounds=3)
    seen = _spy(trainer, monkeypatch)
    m = trainer.step(1)
    assert m["gen_rounds"] > 1, "the seed should need more than one round"
    scored = torch.cat([rewards for rewards, _ in seen["scores"]])  # every round's rows
    failed = int(scored.isnan().sum())
    assert m["errored/reward"] == failed == m["reward_errors/odd_first_char_raises"]  # a count, not a mean
    assert math.isclose(m["reward/odd_first_char_raises"], scored[~scored.isnan()].mean().item(), rel_tol=1e-6)


def test_the_scorer_metrics_of_two_processes_sum_their_counts_and_weigh_means_by_verdicts():
    from grpo.sampling.rounds import whole_draw_means

    ranks = [(8, {"reward/r": 0.5, "reward_errors/r": 4.0, "reward_timeouts/r": 1.0, "reward_none/r": 0.0}),
             (8, {"reward/r": 1.0, "reward_errors/r": 0.0, "reward_timeouts/r": 0.0, "reward_none/r": 2.0})]
    world = SimpleNamespace(size=2, gather_objects=lambda mine: [mine, ranks[1]])
    pooled = whole_draw_means(world, *ranks[0])
    assert pooled["reward_errors/r"] == 4.0 and pooled["reward_timeouts/r"] == 1.0 and pooled["reward_none/r"] == 2.0
    # verdicts: 8 - 4 = 4 on rank 0 (mean 0.5), 8 - 2 = 6 on rank 1 (mean 1.0): (4 * 0.5 + 6 * 1.0) / 10
    assert pooled["reward/r"] == pytest.approx(0.8)


class RaisesOnOddTurnText:
    """An environment that raises when the policy's turn has an odd length: a bug in the environment."""

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, messages):
        if len(messages[-1]["content"]) % 2:
            raise RuntimeError("environment bug")
        return [{"role": "user", "content": "go on"}], 1.0, True


def test_an_environment_that_raises_makes_its_row_errored_in_training(monkeypatch):
    from conftest import make_model, make_tokenizer
    from tiny_run import tiny_config, tiny_task

    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    tokenizer = make_tokenizer()
    # any of a-h ends a turn, so most turns end on their own and reach the environment's step
    config = tiny_config(stop=tuple("abcdefgh"), max_new_tokens=8, max_turns=2, prompts_per_step=8, group_size=4,
                         seed=0)
    setup_process(config)
    model = make_model(len(tokenizer), seed=3)
    trainer = GRPOTrainer(resolve_run(config, task=tiny_task(), model=model), model=model, tokenizer=tokenizer,
                          env=RaisesOnOddTurnText, progress=False)
    seen = _spy(trainer, monkeypatch)
    episodes = []
    run = trainer.agent.run

    def keep(*args, **kwargs):
        rollout = run(*args, **kwargs)
        episodes.extend(rollout.episodes)
        return rollout

    trainer.agent.run = keep
    m = trainer.step(1)
    broken = torch.tensor([e.env_error is not None for e in episodes])
    assert broken.any() and (~broken).any()
    assert m["errored/environment"] == int(broken.sum()) == m["env_errors"] and m["errored/reward"] == 0
    mask, advantages, lengths, _ = seen["update"][0]
    assert mask[broken].sum() == 0 and advantages[broken].abs().sum() == 0 and lengths[broken].sum() == 0


class ClosedOnSomeRows:
    """Cannot open some tasks: reset raises for every episode of their groups; the others end after one turn."""

    def reset(self, example):
        if int(example["prompt"].split()[-1]) % 3 == 0:
            raise RuntimeError("no such task")
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, messages):
        return None, 0.0, True


def test_a_group_whose_environment_never_opened_is_left_out_and_counted(monkeypatch):
    from conftest import make_model, make_tokenizer
    from tiny_run import tiny_config, tiny_task

    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    tokenizer = make_tokenizer()
    config = tiny_config(max_turns=2, prompts_per_step=8, group_size=4, seed=0)
    setup_process(config)
    model = make_model(len(tokenizer), seed=3)
    trainer = GRPOTrainer(resolve_run(config, task=tiny_task(), model=model), model=model, tokenizer=tokenizer,
                          env=ClosedOnSomeRows, progress=False)
    seen, drawn, run = _spy(trainer, monkeypatch), [], trainer.agent.run

    def keep(model, tokenizer, rows, **kwargs):
        drawn.extend(rows)
        return run(model, tokenizer, rows, **kwargs)

    trainer.agent.run = keep
    with pytest.warns(RuntimeWarning, match="no such task"):
        m = trainer.step(1)
    closed = torch.tensor([int(row["prompt"].split()[-1]) % 3 == 0 for row in drawn])  # (B,)
    assert closed.any() and (~closed).any(), "the seed should draw rows of both kinds"
    assert m["errored/environment"] == 4 * int(closed.sum()) == m["env_errors"]
    mask, advantages, lengths, _ = seen["update"][0]
    broken = closed.repeat_interleave(4)
    assert mask[broken].sum() == 0 and advantages[broken].abs().sum() == 0 and lengths[broken].sum() == 0
    assert math.isfinite(m["loss"])


def _batch(errors: torch.Tensor) -> object:
    """A batch of one round, its rollout the round's (as sample_batch makes it without filter_groups):
    every row 4 tokens long, with the given errors."""
    from grpo.sampling.rollout import Rollout
    from grpo.sampling.rounds import Batch

    n = len(errors)
    rollout = Rollout(prompt_ids=[[1]] * (n // 3), completion_ids=torch.ones(n, 4, dtype=torch.long),
                      mask=torch.ones(n, 4), logprobs=torch.zeros(n, 4), truncated=torch.zeros(n, dtype=torch.bool),
                      texts=["a"] * n, group_size=3)
    round_ = SimpleNamespace(rollout=rollout)
    return Batch([round_], [{}] * (n // 3), rollout, torch.zeros(n), torch.full((n,), 4.0),
                 torch.zeros(n, dtype=torch.bool), errors)


@pytest.mark.unit
def test_leave_out_errored_empties_the_rows_of_errored_and_of_lone_survivors():
    from grpo.sampling.rounds import leave_out_errored
    from grpo.system.distributed import World

    # groups of 3: the first has one errored row (two valid left), the second two (one left: nothing to
    # compare it with, the whole group leaves), the third none
    errors = torch.tensor([0, 1, 0, 2, 0, 1, 0, 0, 0])
    batch = _batch(errors)
    trained, valid = leave_out_errored(batch, World(), group_size=3, estimator="grpo")
    kept = [True, False, True, False, False, False, True, True, True]
    assert valid.tolist() == kept
    assert trained.rollout.mask.sum(dim=1).tolist() == [4.0 if k else 0.0 for k in kept]  # out of the loss
    assert trained.lengths.tolist() == [4.0 if k else 0.0 for k in kept]  # and out of its normaliser
    # under REINFORCE++ the baseline is the batch's: the lone survivor of the second group keeps its place
    _, valid = leave_out_errored(_batch(errors), World(), group_size=3, estimator="reinforce_pp")
    assert valid.tolist() == (errors == 0).tolist()


@pytest.mark.unit
def test_leave_out_errored_leaves_the_batch_it_is_given_as_it_was():
    from grpo.sampling.rounds import leave_out_errored
    from grpo.system.distributed import World

    batch = _batch(torch.tensor([0, 1, 0, 0, 0, 0]))
    rollout, mask, lengths = batch.rollout, batch.rollout.mask, batch.lengths
    out = leave_out_errored(batch, World(), group_size=3, estimator="grpo")
    # the given batch, its rollout and the round's (the same object) keep every row's tokens
    assert mask.sum().item() == 24.0 and batch.rounds[0].rollout.mask.sum().item() == 24.0
    assert batch.rollout is rollout and batch.rollout.mask is mask
    assert batch.lengths is lengths and lengths.tolist() == [4.0] * 6
    trained, _ = out
    assert trained.rollout.mask[1].sum() == 0 and trained.lengths[1] == 0
    assert trained.rollout is not rollout and trained.rounds is batch.rounds  # the rounds, as sampled, shared


@pytest.mark.unit
def test_row_errors_names_each_cause():
    from grpo.sampling.rounds import ERROR_CAUSES, row_errors

    class Ep:
        def __init__(self, error):
            self.env_error = error

    rewards = torch.tensor([1.0, math.nan, math.nan, 0.0, 0.0])
    rollout = SimpleNamespace(episodes=[Ep(None), Ep(None), Ep("RuntimeError: env bug"), Ep(None), Ep(None)],
                              truncated=torch.tensor([False, False, False, True, False]))
    codes = row_errors(rewards, rollout, mask_truncated=True).tolist()
    assert [ERROR_CAUSES[c - 1] if c else None for c in codes] == [None, "reward", "environment", "truncated", None]
    assert row_errors(rewards, rollout, mask_truncated=False).tolist()[3] == 0  # cut, not masked: the model's 0


def test_the_console_says_so_above_five_percent():
    from grpo.observe.progress import errored_line

    assert errored_line(3, {"errored_frac": 0.05, "errored/reward": 2.0}) is None
    line = errored_line(3, {"errored_frac": 0.25, "errored/reward": 6.0, "errored/environment": 0.0,
                            "errored/truncated": 2.0})
    assert line.startswith("step 3: 25% of the rows errored (6 reward, 2 truncated;") and "\n" not in line


def test_a_run_prints_the_errored_share_and_records_it(tmp_path, capsys):
    import json

    trainer = tiny_trainer(reward=odd_first_char_raises, prompts_per_step=6, group_size=4, seed=5, steps=1)
    trainer.train(tmp_path / "run")
    out = capsys.readouterr().out
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
    assert row["step"] == 1 and row["errored/reward"] > 0.05 * 24
    assert f"step 1: {row['errored_frac']:.0%} of the rows errored ({row['errored/reward']:.0f} reward;" in out
