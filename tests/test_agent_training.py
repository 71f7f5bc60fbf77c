"""Training on episodes: the tiny model's multi-turn runs learn, log their episodes and resume exactly."""

from __future__ import annotations

import json

import torch
from conftest import make_model, make_tokenizer
from test_checkpoint import _same_params
from tiny_run import count_a, metrics_lines, params, tiny_config, tiny_task

from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.sampling.rounds import sample_and_score
from grpo.tasks import Task


class Talk:
    """Replies to every turn until the third; rewards each turn by the parity of its length (which varies
    within almost every group of a random tiny model, so every step has signal)."""

    def reset(self, example):
        self.turns = 0
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, messages):
        self.turns += 1
        text = messages[-1]["content"]
        return [{"role": "user", "content": f"turn {self.turns}"}], float(len(text) % 2), self.turns >= 3


def double(x: int) -> int:
    """Double a number.

    Args:
        x: the number
    """
    return 2 * x


def agent_trainer(env=Talk, tools=None, task=None, env_spec="", tools_spec="", **kw) -> GRPOTrainer:
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    # any "a" ends a turn, so the random tiny model takes several
    config = tiny_config(stop=("a",), max_new_tokens=8, max_turns=3, env=env_spec, tools=tools_spec, **kw)
    setup_process(config)
    return GRPOTrainer(resolve_run(config, task=task or tiny_task(), model=model), model=model, tokenizer=tokenizer,
                       env=env, tools=tools, progress=False)


def watch_trained_logprobs(trainer: GRPOTrainer) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every (mask, env_mask, gradient of the loss with respect to the log-probs) of the training passes: the
    log-probs the update's loss is built on come out of the policy (grpo.system.distributed.ModelCalls) with gradients."""
    seen = []

    def hook(module, args, output):
        fn, sub = args[0], args[1] if len(args) > 1 else None
        if getattr(fn, "__name__", "") == "rollout_logprobs" and output[0].requires_grad:
            mask, env_mask = sub.mask.clone(), sub.env_mask.clone()
            output[0].register_hook(lambda grad: seen.append((mask, env_mask, grad.detach().clone())))

    trainer.policy.register_forward_hook(hook)
    return seen


def test_multi_turn_run_trains_and_logs_episodes(tmp_path):
    trainer = agent_trainer(steps=2, sample_every=1)
    before = params(trainer)
    trained = watch_trained_logprobs(trainer)
    trainer.train(tmp_path / "run")
    assert any(not torch.equal(before[k], v) for k, v in params(trainer).items())
    # the environment's tokens are context: no gradient reaches their log-probs; the policy's carry it
    assert trained and sum(float(env.sum()) for _, env, _ in trained) > 0
    for mask, env, grad in trained:
        assert grad.shape == mask.shape and (mask * env).sum() == 0
        assert torch.equal(grad * env, torch.zeros_like(grad))
        assert torch.equal(grad * (1 - mask), torch.zeros_like(grad))  # nor to padding
    assert any(bool((grad * mask).abs().sum() > 0) for mask, _, grad in trained)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "turns_per_episode" in x]
    assert len(steps) == 2 and all(x["turns_per_episode"] > 1 and 0 < x["env_token_frac"] < 1 for x in steps)
    assert all(x["env_errors"] == 0 and x["tool_calls_per_episode"] == 0 for x in steps)
    samples = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert samples and all(s["transcript"][0]["role"] == "assistant" for s in samples)
    assert any(s["turns"] > 1 and [m["role"] for m in s["transcript"][:3]] == ["assistant", "user", "assistant"]
               for s in samples)
    assert all(s["completion"] == s["transcript"][-1]["content"] or s["transcript"][-1]["role"] != "assistant"
               for s in samples)


def test_length_aware_rewards_count_the_scored_turn_against_the_per_turn_limit():
    seen = []

    def length(completion, example):
        seen.append((len(completion), example["completion_tokens"], example["max_completion_tokens"]))
        return 0.0

    trainer = agent_trainer(task=tiny_task(length))
    rollout, *_ = sample_and_score(trainer.sampling, list(range(4)), torch.Generator().manual_seed(0))
    assert max(e.turns for e in rollout.episodes) > 1
    assert any(n > 8 for n in rollout.lengths.tolist())  # the policy's tokens summed over turns
    # the character tokenizer: one token a character, but the random model's special tokens decode to nothing
    assert all(chars <= tokens <= limit == 8 for chars, tokens, limit in seen), seen


def test_multi_turn_run_resumes_exactly(tmp_path):
    straight = agent_trainer(steps=3)
    straight.train(tmp_path / "straight")
    agent_trainer(steps=1).train(tmp_path / "split")
    resumed = agent_trainer(steps=3)
    resumed.train(tmp_path / "split", resume=True)
    _same_params(params(straight), params(resumed))
    assert metrics_lines(tmp_path / "straight") == metrics_lines(tmp_path / "split")


def test_tools_make_episodes_with_the_tools_described(tmp_path):
    trainer = agent_trainer(env=None, tools=[double], steps=1)
    try:
        opening = trainer.agent.make_env().reset({"prompt": "hi"})
        assert "double(x: integer)" in opening[0]["content"] and "<tool>" in opening[0]["content"]
        trainer.train(tmp_path / "run")
    finally:
        trainer.toolbox.close()


def _readme_block(after: str) -> str:
    """The first python block after the words ``after`` in docs/tools.md (README's journey pages)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "tools.md").read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


def test_readme_examples_run(monkeypatch, tmp_path):
    """docs/tools.md's tool and environment examples, with grpo.train pointed at the tiny model and task."""
    import grpo

    def tiny_train(config, **kw):
        rows = [{"prompt": f"guess {i}", "answer": str(i)} for i in range(40)]
        task = Task("numbers", rows[:32], rows[32:], count_a)
        trainer = agent_trainer(env=kw.get("env"), tools=kw.get("tools"), task=task, steps=1)
        try:
            return trainer.train(tmp_path / f"run{len(list(tmp_path.iterdir()))}")
        finally:
            if trainer.toolbox is not None:
                trainer.toolbox.close()

    monkeypatch.setattr(grpo, "train", tiny_train)
    tools_example = {}
    exec(_readme_block("Tools are typed functions"), tools_example)
    assert tools_example["lookup"]("grpo") == "group relative policy optimization"
    env_example = {}
    exec(_readme_block("An environment is a class"), env_example)
    env = env_example["Guess"]()
    env.reset({"answer": "42"})
    assert env.step([{"role": "assistant", "content": "50"}]) == ([{"role": "user", "content": "lower"}], 0.0, False)
    assert env.step([{"role": "assistant", "content": "42"}]) == (None, 1.0, True)


def test_env_and_tools_options_load_from_files(tmp_path):
    """--env path.py:Class and --tools path.py:fn, as the command line gives them."""
    (tmp_path / "my_env.py").write_text(
        "class Once:\n"
        "    def reset(self, example):\n        return [{'role': 'user', 'content': example['prompt']}]\n"
        "    def step(self, messages):\n        return None, 0.5, True\n")
    trainer = agent_trainer(env=None, env_spec=f"{tmp_path / 'my_env.py'}:Once")
    episodes = trainer.agent.run(trainer.model, trainer.tokenizer, trainer.task.train[:1], group_size=2,
                                 max_new_tokens=4, stop_strings=("a",)).episodes
    assert all(e.reward == 0.5 or e.turns == 1 for e in episodes)
    trainer = agent_trainer(env=None, tools_spec="grpo.tasks.calc:calculator")
    try:
        assert trainer.toolbox.order == ["calculator"]
    finally:
        trainer.toolbox.close()
