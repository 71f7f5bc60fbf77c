"""A tiny-model GRPO run, shared by the checkpoint tests and the kill harness (tests/kill_harness.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import make_model, make_tokenizer

from grpo.config import TrainConfig
from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.tasks import Task

TIMING = ("seconds_env", "seconds_tools", "time_generate", "time_generate_zero_var", "time_screen", "time_screen_skipped", "generate_wasted_frac", "time_reward", "time_update", "time_step", "time_eval", "tokens_per_second", "time_wait_sampler", "time_wait_trainer", "time_sync")


def count_a(completion, example):
    """The share of characters that are 'a': a tiny model learns it in a few steps."""
    return completion.count("a") / max(len(completion), 1)


def tiny_task(reward=count_a) -> Task:
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    return Task("tiny", rows[:32], rows[32:], reward)


def tiny_config(*, not_given: tuple[str, ...] = (), **kw) -> TrainConfig:
    """The tiny run's config; ``not_given`` options are left to their defaults, as a user who names none of
    them (the run may adapt those)."""
    base = dict(preflight="off", eval_every=-1, temperature=1.0, sampler="uniform", filter_groups=False, steps=4, prompts_per_step=4, group_size=4, max_new_tokens=6, lr=1e-2, warmup_steps=1,
                eval_size=8, sample_every=2, device="cpu", save_model=False, save_every=1, reward_workers=0)
    return TrainConfig(**{k: v for k, v in {**base, **kw}.items() if k not in not_given})


def tiny_trainer(reward=count_a, **kw) -> GRPOTrainer:
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    config = tiny_config(**kw)
    setup_process(config)
    return GRPOTrainer(resolve_run(config, task=tiny_task(reward), model=model), model=model, tokenizer=tokenizer,
                       progress=False)


def config_trainer(config: TrainConfig, **resolved) -> GRPOTrainer:
    """A trainer of the tiny model for ``config``, resolved for one process with ``resolved``'s arguments
    (``origin``, ``resumed``: the sources of a parsed command line, of a resumed run)."""
    tokenizer = make_tokenizer()
    setup_process(config)
    model = make_model(len(tokenizer), seed=3)
    return GRPOTrainer(resolve_run(config, model=model, processes=1, **resolved), model=model, tokenizer=tokenizer,
                       progress=False)


def params(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def metrics_lines(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its timing fields, which differ between any two runs."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]
