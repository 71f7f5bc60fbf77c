"""Every pass that runs the model keeps within one token budget, micro_batch_tokens: sampling's prefill,
the reference's and the old policy's log-probs, the update, evaluation and the pre-flight's timing.

A model call's size is its rows times the tokens it feeds (the width of ``input_ids`` or
``inputs_embeds``), recorded by wrapping the decoder's forward. A call holds at most the budget, or one
row when that row alone is over it (a long conversation re-encoded), as the update's packing has it.
"""

from __future__ import annotations

import pytest
import torch
from tiny_run import tiny_trainer

from grpo.learning.logprobs import rollout_logprobs
from grpo.learning.update import scored_logprobs
from grpo.observe.heldout import evaluate_heldout
from grpo.sampling.rounds import sample_batch

BUDGET = 48  # a tiny-task prompt is ~25 tokens, a group 4 x 6 completion tokens: most passes must split


def record_calls(*models: torch.nn.Module) -> list[tuple[int, int]]:
    """(rows, tokens) of every decoder call of ``models`` from now on."""
    calls: list[tuple[int, int]] = []
    for model in models:
        decoder = model.get_decoder()
        own = decoder.forward

        def forward(*args, _own=own, **kwargs):
            fed = kwargs.get("input_ids")
            fed = kwargs.get("inputs_embeds") if fed is None else fed
            calls.append((fed.shape[0], fed.shape[1]))
            return _own(*args, **kwargs)

        decoder.forward = forward
    return calls


def over_budget(calls: list[tuple[int, int]], budget: int = BUDGET) -> list[tuple[int, int]]:
    """The calls of several rows whose tokens exceed the budget."""
    return [(rows, width) for rows, width in calls if rows > 1 and rows * width > budget]


@pytest.mark.parametrize("passes", ["reference", "old_policy"])
def test_every_model_call_of_a_step_and_an_evaluation_keeps_within_the_token_budget(passes):
    # reference: beta > 0 runs the frozen copy; old_policy: TIS off-policy (2 epochs x 2 minibatches) runs pi_old
    options = {"beta": 0.04} if passes == "reference" else {"epochs": 2, "minibatches": 2}
    trainer = tiny_trainer(micro_batch_tokens=BUDGET, steps=1, eval_size=8, **options)
    try:
        models = [trainer.model] + ([trainer.reference.model] if trainer.reference is not None else [])
        calls = record_calls(*models)
        batch = sample_batch(trainer.sampling, 1)
        sampled = len(calls)
        trainer.batches.next = lambda step: (batch, {})
        trainer.step(1)
        trained = len(calls)
        evaluate_heldout(trainer.sampling)
        from grpo.learning.update import update_seconds

        update_seconds(trainer.learner, batch.rollout)
        assert sampled > 0 and trained > sampled and len(calls) > trained
        assert over_budget(calls) == []
    finally:
        trainer.close()


def test_log_probs_computed_within_the_budget_equal_those_of_one_pass_over_every_row():
    small = tiny_trainer(micro_batch_tokens=BUDGET)
    whole = tiny_trainer()  # the default budget holds the whole tiny batch in one micro-batch
    try:
        rollout = sample_batch(small.sampling, 1).rollout
        with torch.no_grad():
            once, _ = rollout_logprobs(small.model, rollout, small.tokenizer.pad_token_id)
        split = scored_logprobs(small.learner, small.policy, rollout)
        torch.testing.assert_close(split, once, atol=1e-5, rtol=0)
        assert torch.equal(scored_logprobs(whole.learner, whole.policy, rollout), once)  # the default path: bitwise
    finally:
        small.close()
        whole.close()


@pytest.mark.parametrize("reencode", [False, True])
def test_an_episodes_prefills_keep_within_the_budget_and_sample_the_same(reencode):
    # each turn after the first runs the environment's reply (~27 tokens) onto every live row's cache (or,
    # re-encoding, the whole conversation): those prefills are split as the first one (2 x 25 tokens) is
    budget = 30
    from conftest import make_model, make_tokenizer
    from test_episodes import ROWS, Echo

    from grpo.sampling.episodes import Agent

    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    agent = Agent(Echo, max_turns=4, max_episode_tokens=200, reencode=reencode)

    def run(budget: int):
        # a vowel ends a turn: most of the 8 episodes take three turns, 6 rows continuing at once
        return agent.run(model, tokenizer, ROWS, group_size=4, max_new_tokens=30, stop_strings=("a", "e", "o"),
                         generator=torch.Generator().manual_seed(0), token_budget=budget)

    whole = run(0)
    calls = record_calls(model)
    split = run(budget)
    assert sum(e.turns >= 2 for e in split.episodes) >= 2 and calls and over_budget(calls, budget) == []
    assert torch.equal(split.completion_ids, whole.completion_ids)
    torch.testing.assert_close(split.logprobs, whole.logprobs, atol=1e-5, rtol=0)
