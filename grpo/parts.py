"""What the phases of a step (grpo/batch.py, update.py, step_metrics.py, heldout.py, run_state.py) read of
the trainer: the parts :class:`grpo.trainer.GRPOTrainer` builds, named once, so that each phase depends on
these and not on the trainer that calls it."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from grpo.ahead import SamplingAhead
    from grpo.config import TrainConfig
    from grpo.distributed import Policy, World
    from grpo.episodes import Agent
    from grpo.evaluate import EvalResult
    from grpo.rewards.combine import RewardScorer
    from grpo.sampler import DrawCounts, FrontierSampler, UniformSampler
    from grpo.screen import Screen
    from grpo.tasks import Task
    from grpo.vllm_engine import VLLMEngine


class TrainerParts(Protocol):
    """A trainer's parts, as the phases of a step use them."""

    config: TrainConfig  # frozen once the first step starts
    world: World  # this process's place among the processes (one, or torchrun's)
    device: torch.device
    task: Task
    model: nn.Module  # the policy's module (LoRA-wrapped when asked)
    tokenizer: object
    policy: Policy  # calls of the model that FSDP can see
    reference: Policy | None  # the frozen reference for the KL term
    optimizer: torch.optim.Optimizer
    sampler: UniformSampler | FrontierSampler
    draws: DrawCounts
    screen: Screen | None  # which candidates get a group (grpo/screen.py); None: the sampler's draw as it is
    prompt_rng: random.Random
    order_rng: random.Random | None  # the minibatches' order when sampling runs ahead (else prompt_rng's)
    ahead: SamplingAhead | None  # the batches sampled ahead of the trainer (--async-lag > 0)
    score: RewardScorer  # the rewards, in worker processes with a time limit
    checker: RewardScorer  # the task's checker, the same way
    reward_fns: list[Callable]
    agent: Agent | None  # None: single-turn
    engine: VLLMEngine | None  # None: the own sampler
    autocast: AbstractContextManager
    train_prompts: list[list[int]]
    heldout_prompts: list[list[int]]
    run_dir: Path | None  # where rank 0 writes
    saving: bool

    def evaluate(self, on_batch: Callable[[int], None] | None = None, limit: int | None = None) -> EvalResult: ...
