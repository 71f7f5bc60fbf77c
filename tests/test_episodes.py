"""Multi-turn episodes: the continued cache is exact, environment tokens are context only, limits hold."""

import random

import pytest
import torch

from grpo.config import ConfigError
from grpo.learning.logprobs import rollout_logprobs
from grpo.math.loss import policy_loss
from grpo.sampling.episode_scores import episode_metrics, scored_tokens
from grpo.sampling.episodes import Agent, Episode, EpisodeError
from grpo.sampling.random_streams import stream_keys, stream_seeds


class Echo:
    """Answers every turn with a short message that differs by turn; rewards 0.5 a turn; done after 3 turns."""

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, example):
        return [{"role": "system", "content": "Talk."}, {"role": "user", "content": example["prompt"]}]

    def step(self, messages):
        self.turns += 1
        return [{"role": "user", "content": "more" + "!" * self.turns}], 0.5, self.turns >= 3


class Broken(Echo):
    def step(self, messages):
        raise RuntimeError("env bug")


ROWS = [{"prompt": "hi", "answer": ""}, {"prompt": "tell me more", "answer": ""}]


def _run(model, tokenizer, env=Echo, *, max_turns=4, max_episode_tokens=200, seed=0, **kw):
    agent = Agent(env, max_turns=max_turns, max_episode_tokens=max_episode_tokens, **kw)
    # any "a" ends a turn, so the random tiny model takes several turns
    return agent.run(model, tokenizer, ROWS, group_size=3, max_new_tokens=12, stop_strings=("a",),
                     generator=torch.Generator().manual_seed(seed))


def _text(tokenizer, ids, policy):
    """The transcript as the messages hold it: the policy's turns decoded without the special tokens a
    random model writes anywhere (its end-of-turn token kept), the environment's tokens as they are."""
    out, start = "", 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or policy[k] != policy[start]:
            seg = ids[start:k]
            if policy[start]:
                end = "<|im_end|>" if seg[-1] == tokenizer.eos_token_id else ""
                out += tokenizer.decode(seg, skip_special_tokens=True) + end
            else:
                out += tokenizer.decode(seg)
            start = k
    return out


def _full_forward(model, prompt, ids):
    logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1)


def test_episodes_take_several_turns_and_record_the_transcript(tiny_model, tokenizer):
    r = _run(tiny_model, tokenizer)
    turns = [e.turns for e in r.episodes]
    assert max(turns) >= 2, turns
    for i, e in enumerate(r.episodes):
        roles = [m["role"] for m in e.transcript()]
        assert roles[0] == "assistant" and roles.count("assistant") == e.turns
        assert e.policy_tokens == int(r.mask[i].sum()) and e.env_tokens == int(r.env_mask[i].sum())
        assert e.reward == pytest.approx(0.5 * min(e.turns, 3) if not r.truncated[i] else 0.5 * (e.turns - 1))
    assert (r.mask * r.env_mask).sum() == 0  # a token is the policy's or the environment's
    m = episode_metrics(r.episodes)
    assert m["turns_per_episode"] == pytest.approx(sum(turns) / len(turns)) and 0 < m["env_token_frac"] < 1


def test_continued_cache_logprobs_match_a_fresh_forward_of_the_transcript(tiny_model, tokenizer):
    r = _run(tiny_model, tokenizer)
    spans = r.spans
    for i in range(len(r.texts)):
        n = int(spans[i])
        ids = r.completion_ids[i, :n].tolist()
        fresh = _full_forward(tiny_model, r.prompt_ids[i // 3], ids)
        policy = r.mask[i, :n] > 0
        torch.testing.assert_close(r.logprobs[i, :n][policy], fresh[policy], atol=1e-5, rtol=1e-5)
        # the transcript's tokens are the chat template's rendering of the episode's messages
        rendered = tokenizer.apply_chat_template(r.episodes[i].messages, tokenize=False)
        decoded = tokenizer.decode(r.prompt_ids[i // 3]) + _text(tokenizer, ids, r.mask[i, :n].tolist())
        assert rendered.startswith(decoded) and rendered[len(decoded) :] in ("\n", "<|im_end|>\n")
    for share_prefix in (True, False):
        logp, _ = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id, share_prefix=share_prefix)
        torch.testing.assert_close(logp, r.logprobs, atol=1e-5, rtol=1e-5)
        assert torch.all(logp[r.env_mask > 0] == 0)


def test_gradient_ignores_the_environment_tokens_own_logprobs(tiny_model, tokenizer):
    r = _run(tiny_model, tokenizer)
    adv = torch.linspace(-1, 1, len(r.texts))

    def grads(old_logprobs, shift_env):
        tiny_model.zero_grad()
        logp, _ = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id)
        # what the loss would see if the environment tokens' log-probs were part of it
        logp = logp + shift_env * r.env_mask
        loss, _ = policy_loss(logp, old_logprobs, adv, r.mask)
        loss.backward()
        return [p.grad.clone() for p in tiny_model.parameters()]

    base = grads(r.logprobs, 0.0)
    changed = grads(r.logprobs + 3.0 * r.env_mask, -5.0)
    for a, b in zip(base, changed, strict=True):
        torch.testing.assert_close(a, b)
    assert any(g.abs().sum() > 0 for g in base)


def test_episode_token_limit_and_turn_limit(tiny_model, tokenizer):
    r = _run(tiny_model, tokenizer, max_turns=2)
    assert max(e.turns for e in r.episodes) <= 2
    r = _run(tiny_model, tokenizer, max_episode_tokens=30)
    assert int(r.spans.max()) <= 30
    for i, e in enumerate(r.episodes):  # a reply with no room left is not in the transcript, nor counted
        assert e.env_tokens == int(r.env_mask[i].sum()) and e.policy_tokens == int(r.mask[i].sum())


def test_a_reward_sees_the_scored_turns_tokens_not_the_sum_over_turns(tiny_model, tokenizer):
    # completion_tokens is compared with max_new_tokens, a per-turn limit: it must count the last policy
    # turn (the completion scored), not every policy token of the episode
    r = _run(tiny_model, tokenizer)
    counted = scored_tokens(r)
    for i, e in enumerate(r.episodes):
        policy = r.mask[i, : int(r.spans[i])]
        last_turn = int(policy.flip(0).cumprod(0).sum())  # the trailing run of policy tokens
        assert counted[i] == e.last_turn_tokens == last_turn <= 12
    assert any(n > 12 for n in r.lengths.tolist())  # summed over turns, past the per-turn limit
    single = _run(tiny_model, tokenizer, max_turns=1)
    assert scored_tokens(single) == single.lengths.tolist()


def test_an_environment_that_raises_ends_its_episode_or_the_run(tiny_model, tokenizer):
    with pytest.warns(RuntimeWarning, match="env bug"):
        r = _run(tiny_model, tokenizer, env=Broken)
    stopped = [e for e in r.episodes if e.env_error]
    assert stopped and all(e.turns == 1 and e.reward == 0 for e in stopped)
    assert episode_metrics(r.episodes)["env_errors"] == len(stopped)
    with pytest.raises(EpisodeError, match="env bug"):
        _run(tiny_model, tokenizer, env=Broken, on_error="raise")


class ClosedOnHi(Echo):
    """Cannot open the task "hi" (its reset raises for every episode of that group); opens the others."""

    def reset(self, example):
        if example["prompt"] == "hi":
            raise RuntimeError("no such task")
        return super().reset(example)


def test_a_group_whose_every_reset_raised_is_errored_rows_not_a_stop(tiny_model, tokenizer):
    with pytest.warns(RuntimeWarning, match="no such task"):
        r = _run(tiny_model, tokenizer, env=ClosedOnHi)
    closed, other = r.episodes[:3], r.episodes[3:]  # group 0 is the row "hi"
    assert all(e.env_error == "RuntimeError: no such task" and e.turns == 0 for e in closed)
    assert r.mask[:3].sum() == 0 and r.env_mask[:3].sum() == 0  # not sampled: nothing to train on
    assert all(e.env_error is None and e.turns >= 1 for e in other) and r.mask[3:].sum(dim=1).min() > 0
    assert episode_metrics(r.episodes)["env_errors"] == 3
    with pytest.raises(EpisodeError, match="no such task"):
        _run(tiny_model, tokenizer, env=ClosedOnHi, on_error="raise")
    agent = Agent(ClosedOnHi, max_turns=2, max_episode_tokens=60)
    with pytest.warns(RuntimeWarning, match="no such task"):
        alone = agent.run(tiny_model, tokenizer, ROWS[:1], group_size=3, max_new_tokens=4)  # no group opened
    assert all(e.env_error for e in alone.episodes) and alone.mask.sum() == 0


class Unseeded(Echo):
    """Draws its task from the global RNG: the G episodes of a row get different tasks."""

    def reset(self, example):
        return [{"role": "user", "content": f"{example['prompt']} {random.randrange(10**9)}"}]


class Seeded(Echo):
    """Draws its task from the seed it is given, and records the seed."""

    seeds: list[int] = []

    def reset(self, example, seed):
        Seeded.seeds.append(seed)
        return [{"role": "user", "content": f"{example['prompt']} {random.Random(seed).randrange(10**9)}"}]


def _run_streams(model, tokenizer, env, step=0):
    streams = stream_keys(7, step, 0, torch.arange(len(ROWS) * 3))  # as the trainer keys a round
    return Agent(env, max_turns=2, max_episode_tokens=60).run(model, tokenizer, ROWS, group_size=3,
                                                              max_new_tokens=4, streams=streams)


def test_a_group_whose_openings_differ_stops_with_one_line_naming_the_environment(tiny_model, tokenizer):
    with pytest.raises(ConfigError, match="environment Unseeded: the 3 episodes of row 0 opened with different") as err:
        _run_streams(tiny_model, tokenizer, Unseeded)
    assert "\n" not in str(err.value)


def test_reset_gets_one_seed_per_group_the_same_on_a_rerun(tiny_model, tokenizer):
    Seeded.seeds = []
    first = _run_streams(tiny_model, tokenizer, Seeded)
    seeds = Seeded.seeds
    assert seeds == [seeds[0]] * 3 + [seeds[3]] * 3 and seeds[0] != seeds[3]  # one per group of 3
    assert seeds[::3] == stream_seeds(stream_keys(7, 0, 0, torch.tensor([0, 3])))  # the group's first stream
    openings = [e.messages[: e.opening] for e in first.episodes]
    assert openings[0] == openings[1] == openings[2] != openings[3] == openings[4] == openings[5]
    Seeded.seeds = []
    again = _run_streams(tiny_model, tokenizer, Seeded)
    assert Seeded.seeds == seeds and [e.messages[: e.opening] for e in again.episodes] == openings
    Seeded.seeds = []
    _run_streams(tiny_model, tokenizer, Seeded, step=1)
    assert Seeded.seeds[::3] != seeds[::3]  # another step, other tasks
    # without streams (the pre-flight check) the seed comes from the generator, as reproducible
    Seeded.seeds = []
    _run(tiny_model, tokenizer, Seeded, max_turns=1)
    _run(tiny_model, tokenizer, Seeded, max_turns=1)
    assert Seeded.seeds[:6] == Seeded.seeds[6:] and len(set(Seeded.seeds[:6])) == 2
    # greedy evaluation (neither): still a seed per group, and torch's global generator left alone
    Seeded.seeds, state = [], torch.get_rng_state()
    Agent(Seeded, max_turns=1, max_episode_tokens=60).run(tiny_model, tokenizer, ROWS, group_size=3,
                                                          max_new_tokens=4, temperature=0.0)
    assert torch.equal(torch.get_rng_state(), state) and len(set(Seeded.seeds)) == 2


def test_episode_record_keeps_the_opening_apart():
    e = Episode([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], opening=1)
    assert e.transcript() == [{"role": "assistant", "content": "a"}]


def test_continued_cache_and_reencoding_sample_the_same_greedy_episodes(tiny_model, tokenizer):
    def greedy(reencode):
        agent = Agent(Echo, max_turns=4, max_episode_tokens=200, reencode=reencode)
        # the random tiny model's greedy turns are newlines: three end a turn
        return agent.run(tiny_model, tokenizer, ROWS, group_size=2, max_new_tokens=12, stop_strings=("\n\n\n",),
                         temperature=0.0)

    a, b = greedy(False), greedy(True)
    assert max(e.turns for e in a.episodes) >= 2
    assert [e.messages for e in a.episodes] == [e.messages for e in b.episodes]
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


class FakeEngine:
    """An engine with vLLM's ``sample`` interface that samples each whole conversation on the policy
    itself (greedy): the engine path of Agent.run, without vLLM."""

    def __init__(self, model, tokenizer, max_model_len=10_000):
        self.model, self.tokenizer, self.max_model_len = model, tokenizer, max_model_len
        self.requests = []

    def sample(self, conversations, *, max_tokens, drawn, streams=None, generator=None, temperature=1.0,
               top_p=1.0, top_k=0, stop_strings=()):
        from grpo.sampling.rollout import generate

        self.requests.append([len(c) + m for c, m in zip(conversations, max_tokens, strict=True)])
        out = []
        for conversation, limit in zip(conversations, max_tokens, strict=True):
            r = generate(self.model, self.tokenizer, [conversation], group_size=1, max_new_tokens=limit,
                         temperature=0.0, stop_strings=stop_strings)
            n = int(r.lengths[0])
            out.append((r.completion_ids[0, :n].tolist(), r.logprobs[0, :n].tolist(), not bool(r.truncated[0])))
        return out


@pytest.mark.parametrize("limit", [200, 30])
def test_the_engine_path_runs_the_episodes_the_own_engine_runs(tiny_model, tokenizer, limit):
    def run(engine):
        agent = Agent(Echo, max_turns=4, max_episode_tokens=limit)
        return agent.run(tiny_model, tokenizer, ROWS, group_size=2, max_new_tokens=12, stop_strings=("\n\n\n",),
                         temperature=0.0, engine=engine)

    own, engine = run(None), run(FakeEngine(tiny_model, tokenizer))
    assert max(e.turns for e in own.episodes) >= 2
    assert torch.equal(own.completion_ids, engine.completion_ids) and torch.equal(own.mask, engine.mask)
    assert torch.equal(own.truncated, engine.truncated)
    torch.testing.assert_close(own.logprobs, engine.logprobs, atol=1e-5, rtol=1e-5)
    for a, b in zip(own.episodes, engine.episodes, strict=True):
        assert (a.messages, a.turns, a.env_tokens, a.reward) == (b.messages, b.turns, b.env_tokens, b.reward)


def test_the_engine_path_keeps_each_conversation_within_the_engines_length_limit(tiny_model, tokenizer):
    prompt = max(len(p) for p in _run(tiny_model, tokenizer, max_turns=1).prompt_ids)
    fake = FakeEngine(tiny_model, tokenizer, max_model_len=prompt + 20)
    agent = Agent(Echo, max_turns=4, max_episode_tokens=200)
    r = agent.run(tiny_model, tokenizer, ROWS, group_size=2, max_new_tokens=12, stop_strings=("\n\n\n",),
                  temperature=0.0, engine=fake)
    assert max(max(asked) for asked in fake.requests) <= prompt + 20  # no request past the limit
    for i, n in enumerate(r.spans.tolist()):  # each transcript ends within the limit, as with max_episode_tokens
        assert len(r.prompt_ids[i // 2]) + n <= prompt + 20
    assert r.truncated.any()
