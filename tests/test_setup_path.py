"""What the setup before the weights load sees is what the trainer will run: the formatted task."""

from __future__ import annotations

import pytest

from grpo.config import TrainConfig
from grpo.prompts import format_task, r1_zero_reward
from grpo.rewards import code_tests
from grpo.rewards.sandbox import needs_sandbox
from grpo.tasks import get_task


def test_the_r1_zero_wrapper_keeps_a_code_checkers_sandbox_mark():
    # build_scorer turns the sandbox (and --sandbox weak) on from this mark; the wrapper once dropped it
    assert needs_sandbox([code_tests])
    assert needs_sandbox([r1_zero_reward(code_tests)])
    assert not needs_sandbox([r1_zero_reward(lambda completion, example: 1.0)])


def test_the_memory_check_before_loading_sees_the_task_as_the_trainer_formats_it(monkeypatch):
    """Under r1-zero a task's tuned token limit (add: 12) is dropped and pre-flight fits one; the check
    before loading was given the unformatted task, predicting 12-token completions for a 256-token run."""
    from grpo.cli import main

    seen = {}

    def stop(config: TrainConfig, task, nproc: int) -> TrainConfig:
        seen["defaults"], seen["reward"] = dict(task.defaults), task.reward
        raise SystemExit(0)

    monkeypatch.setattr("grpo.memory_check.check_memory", stop)
    with pytest.raises(SystemExit):
        main(["train", "--task", "add", "--prompt-format", "r1-zero", "--steps", "1"])
    assert "max_new_tokens" not in seen["defaults"]
    assert getattr(seen["reward"], "r1_zero", False)
    formatted = format_task(get_task("add"), TrainConfig(prompt_format="plain"))
    assert formatted.defaults.get("max_new_tokens") == 12  # the plain format keeps it: the test tells them apart
