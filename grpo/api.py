"""``grpo.train``: the Python entry point, the same path as ``grpo train``: the configuration resolved and
every refusal made before anything loads (grpo.run.build.resolve_run), the memory check, then the trainer."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from torch import nn

from grpo.config import TrainConfig
from grpo.run.build import RewardFn, check_before_loading, resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.tasks import Task, say_data


def train(
    config: TrainConfig | None = None,
    *,
    model: nn.Module | None = None,
    tokenizer: object | None = None,
    task: Task | None = None,
    rewards: Sequence[RewardFn | str] | None = None,
    run_dir: str | Path | None = None,
    progress: bool = True,
    tools: Sequence[Callable] | None = None,
    env: Callable | None = None,
    **overrides: object,
) -> dict:
    """Python entry point: ``grpo.train(TrainConfig(steps=10), rewards=[my_reward])``; ``tools=[fn, ...]``
    or ``env=MyEnv`` (a class or factory: one environment per episode) make the episodes multi-turn."""
    base = config or TrainConfig()
    # an override is given, even one equal to its default (replace alone records only values that differ)
    config = replace(base, given=base.given | frozenset(overrides), **overrides)
    setup_process(config)
    # refused here, before anything loads
    run = resolve_run(config, task=task, rewards=rewards, model=model, tokenizer=tokenizer)
    if os.environ.get("RANK", "0") == "0":  # once under torchrun, as grpo train says it once
        say_data(run.task)
    if model is None:  # the memory check before loading, as grpo train's (a model given is loaded already)
        run = check_before_loading(run, 1)
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=progress, tools=tools, env=env)
    try:
        return trainer.train(Path(run_dir) if run_dir is not None else None)
    finally:
        trainer.close()
