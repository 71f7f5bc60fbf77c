"""The embedded SmolLM2-135M in episodes: code with sandboxed test feedback over several turns, and calc's calls."""

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy():
    from grpo.models import load_policy

    return load_policy("smollm2")


def test_code_retry_episodes_take_several_turns_with_feedback_masks_and_rewards(policy):
    from grpo.learning.logprobs import rollout_logprobs
    from grpo.sampling.episode_scores import episode_total
    from grpo.sampling.episodes import Agent
    from grpo.tasks import get_task

    task = get_task("code-retry")
    agent = Agent(task.env, max_turns=3, max_episode_tokens=600)
    r = agent.run(policy.model, policy.tokenizer, task.train[:2], group_size=3, max_new_tokens=96, temperature=0.7,
                  generator=torch.Generator().manual_seed(0))
    several = [e for e in r.episodes if e.turns > 1]
    assert several, [e.transcript() for e in r.episodes]
    for i, e in enumerate(r.episodes):
        feedback = [m["content"] for m in e.transcript() if m["role"] == "user"]
        assert len(feedback) == e.turns - 1 or e.turns == 3 or r.truncated[i]
        assert all("tests passed" in f for f in feedback)
        assert 0.0 <= episode_total(0.0, e) <= 1.0 and e.env_error is None
        assert e.policy_tokens == int(r.mask[i].sum()) and e.env_tokens == int(r.env_mask[i].sum())
    # the training pass sees each whole transcript and gives the sampling log-probs back
    logp, _ = rollout_logprobs(policy.model, r, policy.tokenizer.pad_token_id, temperature=0.7)
    torch.testing.assert_close(logp, r.logprobs, atol=2e-4, rtol=1e-3)


def bare_products(n: int) -> list[dict]:
    """calc rows without the added term: a bare product, which the starting model answers through the
    calculator by copying the example exchange (87.5% of 64 greedily), but not in its head."""
    from grpo.tasks.calc import EXAMPLE

    pairs = [(4721 + 37 * i, 38 + 11 * i) for i in range(n)]
    return [{"prompt": [*EXAMPLE, {"role": "user", "content": f"What is {a} * {b}?"}], "answer": str(a * b),
             "question": f"What is {a} * {b}?"} for a, b in pairs]


def test_calc_episodes_call_the_calculator(policy):
    from grpo.sampling.environments import ToolEnv, template_features
    from grpo.sampling.episode_scores import episode_metrics
    from grpo.sampling.episodes import Agent
    from grpo.sampling.tools import ToolBox
    from grpo.tasks import get_task

    task = get_task("calc", heldout_size=4)
    box = ToolBox(task.tools, workers=0)
    native, role = template_features(policy.tokenizer, box.schemas)
    assert (native, role) == (False, "tool")  # SmolLM2's template ignores tools=, renders any role
    agent = Agent(lambda: ToolEnv(box, task.messages, role, native), max_turns=3, max_episode_tokens=300)
    r = agent.run(policy.model, policy.tokenizer, bare_products(4), group_size=1, max_new_tokens=32,
                  temperature=0.0)
    called = [e for e in r.episodes if e.stats["tool_calls"] and e.turns > 1]
    assert called and all(e.transcript()[1]["role"] == "tool" for e in called)
    assert episode_metrics(r.episodes)["tool_calls_per_episode"] > 0


def test_grpo_eval_scores_a_tool_task_through_its_episodes(tmp_path, monkeypatch, capsys):
    """grpo eval runs a task's tools: the bare products are answered only through the calculator (the
    model gets none of them in its head, as the same rows without the tool show)."""
    import json
    from dataclasses import replace

    import grpo.tasks
    from grpo.cli import main

    with_tool = replace(grpo.tasks.get_task("calc", heldout_size=8), heldout=bare_products(8))
    monkeypatch.setattr(grpo.tasks, "get_task", lambda name, heldout_size: with_tool)
    assert main(["eval", "--task", "calc", "--eval-size", "8", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["heldout_size"] == 8 and scored["heldout_accuracy"] >= 0.5, scored
    monkeypatch.setattr(grpo.tasks, "get_task", lambda name, heldout_size: replace(with_tool, tools=()))
    assert main(["eval", "--task", "calc", "--eval-size", "8", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert alone["heldout_accuracy"] == 0.0, alone
