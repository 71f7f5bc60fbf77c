"""Training runs through the reward pipeline: hostile code in the batch, and GSM8K on the real model."""

from pathlib import Path

import pytest

from grpo.config import TrainConfig
from grpo.rewards.code import code_tests
from grpo.tasks import get_task
from grpo.trainer import GRPOTrainer

HOSTILE = [
    "import os\nwhile True:\n    pass",
    "x = bytearray(50 * 10**9)",
    "import os\nfor _ in range(300):\n    if os.fork() == 0:\n        import time; time.sleep(2); os._exit(0)",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
    "import os\nos._exit(0)",
]


def test_code_task_training_survives_hostile_completions(tiny_model, tokenizer, monkeypatch):
    # Short sandbox limits keep the while-True case quick; the reward is the real code_tests.
    from grpo.rewards import code as code_module
    from grpo.rewards.sandbox import Limits

    monkeypatch.setattr(code_module, "DEFAULT_LIMITS", Limits(wall_seconds=2.0, cpu_seconds=1, memory_mb=512))
    monkeypatch.setattr(code_module.run_tests, "__defaults__", (code_module.DEFAULT_LIMITS,))
    config = TrainConfig(temperature=1.0, sampler="uniform", filter_groups=False, steps=2, prompts_per_step=2, group_size=4, max_new_tokens=4, eval_size=2,
                         sample_every=0, device="cpu", save_model=False, reward_workers=2, reward_timeout=10)
    trainer = GRPOTrainer(config, model=tiny_model, tokenizer=tokenizer, task=get_task("code", heldout_size=2),
                          progress=False)
    assert trainer.reward_fns == [code_tests]
    score, seen = trainer.score, []

    def with_hostile(texts, rows, lengths=None, completion_ids=None):
        texts = list(texts)
        texts[: len(HOSTILE)] = [f"```python\n{h}\n```" for h in HOSTILE]
        texts[-1] = f"```python\n{_solution(rows[-1])}\n```"  # one honest, correct answer
        result = score(texts, rows, lengths, completion_ids)
        seen.append(result[0].tolist())
        return result

    trainer.score = with_hostile
    summary = trainer.train()
    assert summary["steps"] == 2
    for rewards in seen:
        assert rewards[: len(HOSTILE)] == [0.0] * len(HOSTILE)
        assert rewards[-1] == 1.0


def _solution(row):
    """A correct solution for a code-task row, read off its prompt."""
    prompt = row["prompt"]
    k = int(prompt.split("x + ")[1].split(".")[0]) if "add_k" in prompt else None
    if k is not None:
        return f"def add_k(x):\n    return x + {k}"
    if "scale" in prompt:
        k = int(prompt.split("multiplied by ")[1].split(".")[0])
        return f"def scale(xs):\n    return [x * {k} for x in xs]"
    if "count_letter" in prompt:
        letter = prompt.split("times '")[1][0]
        return f"def count_letter(s):\n    return s.count({letter!r})"
    k = int(prompt.split("greater than ")[1].split(",")[0])
    return f"def above(xs):\n    return [x for x in xs if x > {k}]"


@pytest.mark.slow
def test_gsm8k_with_math_answer_and_think_format_on_the_embedded_model(tmp_path):
    fixture = Path(__file__).parent / "fixtures" / "gsm8k_small.jsonl"
    config = TrainConfig(
        temperature=1.0, sampler="uniform", filter_groups=False,
        data=str(fixture), rewards=("math_answer", "think_format"), reward_weights=(1.0, 0.2),
        system_prompt="Think in <think></think>, then give the final number in <answer></answer>.",
        steps=2, prompts_per_step=2, group_size=4, max_new_tokens=48, eval_size=2, eval_batch_size=2,
        sample_every=1, device="cpu", save_model=False, reward_workers=2,
    )
    trainer = GRPOTrainer(config, progress=False)
    summary = trainer.train(tmp_path / "run")
    assert summary["steps"] == 2
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "reward/math_answer" in metrics and "reward/think_format" in metrics
    assert "reward_errors/math_answer" in metrics
