"""Training runs through the reward pipeline: hostile code in the batch, and GSM8K on the real model."""

from pathlib import Path

import pytest
from unguarded import in_process_score

from grpo.config import TrainConfig
from grpo.rewards.code import code_tests
from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.tasks import get_task

NAMES = ("add_k", "scale", "count_letter", "above")  # every function the code task asks for


def _as_every_function(body: str) -> str:
    indented = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return "\n".join(f"def {name}(*args):\n{indented}\n" for name in NAMES)


# Attacks on the verdict: each beats the previous, in-process harness (checked below), and must score 0 here.
VERDICT_ATTACKS = [
    _as_every_function("""
import sys, os
f = sys._getframe()
while f is not None:
    if "_nonce" in f.f_globals:
        n = f.f_globals["_nonce"]
        for i in range(8):
            os.write(1, f"{n} pass {i}\\n".encode())
        os.write(1, f"{n} done\\n".encode())
        os._exit(0)
    f = f.f_back
"""),
    "class A:\n    __eq__ = lambda s, o: True\n    __hash__ = object.__hash__\n" + _as_every_function("return A()"),
    "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\n" + _as_every_function("return I(0)"),
]
# Attacks on the machine: training must go on, and they score 0.
BOMBS = [
    "while True:\n    pass\n" + _as_every_function("return 0"),
    "x = bytearray(50 * 10**9)\n" + _as_every_function("return 0"),
    _as_every_function("import os\nfor _ in range(100):\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '2'])"),
    _as_every_function("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)"),
]
HOSTILE = VERDICT_ATTACKS + BOMBS


def test_the_verdict_attacks_beat_an_in_process_harness():
    row = get_task("code", heldout_size=2).heldout[0]
    for attack in VERDICT_ATTACKS:
        assert in_process_score(attack, row["tests"]) == 1.0, attack


def test_code_task_training_survives_hostile_completions(tiny_model, tokenizer, monkeypatch):
    # Short sandbox limits keep the while-True case quick; the reward is the real code_tests.
    from grpo.rewards import code as code_module
    from grpo.rewards.sandbox import Limits

    monkeypatch.setattr(code_module.evaluate, "__defaults__", (Limits(wall_seconds=2.0, cpu_seconds=1, memory_mb=512),))
    config = TrainConfig(preflight="off", temperature=1.0, sampler="uniform", filter_groups=False, steps=2, prompts_per_step=2, group_size=4, max_new_tokens=4, eval_size=2,
                         sample_every=0, device="cpu", save_model=False, reward_workers=2, reward_timeout=10)
    setup_process(config)
    run = resolve_run(config, task=get_task("code", heldout_size=2), model=tiny_model)
    trainer = GRPOTrainer(run, model=tiny_model, tokenizer=tokenizer, progress=False)
    assert trainer.reward_fns == [code_tests]
    score, seen = trainer.sampling.scoring.score, []

    def with_hostile(texts, rows, lengths=None, completion_ids=None, **kwargs):
        texts = list(texts)
        texts[: len(HOSTILE)] = [f"```python\n{h}\n```" for h in HOSTILE]
        texts[-1] = f"```python\n{rows[-1]['solution']}\n```"  # one honest, correct answer
        result = score(texts, rows, lengths, completion_ids, **kwargs)
        seen.append(result[0].tolist())
        return result

    trainer.sampling.scoring.score = with_hostile
    summary = trainer.train()
    assert summary["steps"] == 2
    for rewards in seen:
        assert rewards[: len(HOSTILE)] == [0.0] * len(HOSTILE)
        assert rewards[-1] == 1.0


@pytest.mark.slow
def test_gsm8k_with_math_answer_and_think_format_on_the_embedded_model(tmp_path):
    fixture = Path(__file__).parent / "fixtures" / "gsm8k_small.jsonl"
    config = TrainConfig(
        preflight="off",
        temperature=1.0, sampler="uniform", filter_groups=False,
        data=str(fixture), rewards=("math_answer", "think_format"), reward_weights=(1.0, 0.2),
        system_prompt="Think in <think></think>, then give the final number in <answer></answer>.",
        steps=2, prompts_per_step=2, group_size=4, max_new_tokens=48, eval_size=2, eval_batch_size=2,
        sample_every=1, device="cpu", save_model=False, reward_workers=2,
    )
    setup_process(config)
    trainer = GRPOTrainer(resolve_run(config), progress=False)
    summary = trainer.train(tmp_path / "run")
    assert summary["steps"] == 2
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "reward/math_answer" in metrics and "reward/think_format" in metrics
    assert "reward_errors/math_answer" in metrics
