"""The two sides of a step, as plain values the phases take: ``Sampling`` (what generating, scoring and
evaluating read: grpo/sampling/rounds.py, grpo/observe/heldout.py, grpo/run/step_metrics.py, grpo/run/preflight.py) and ``Learner``
(what the update reads: grpo/learning/update.py). The trainer builds both once its config is settled (where the
pre-flight check may change the config, the check first gets a pair of its own, with no prompt sampler: it
draws its own prompts); sampling ahead (grpo/run/async_batches.py) samples from a copy of ``Sampling`` whose
``Generation`` has a model of its own.

``Sampling`` holds one record per phase, cut by what each phase reads: ``Generation`` (the policy, how
it runs and on which processes), ``Scoring`` (the rewards and the checker), ``Drawing`` (the prompt
sampler, the draw counts and the screen). A function that reads one record takes that record
(``reordered_rounds``, ``samples_on_the_policy``); the phases that read several (a round: drawing,
generating and scoring; an evaluation; a step's metrics; the pre-flight check) take the whole
``Sampling``, which also holds what every phase reads: the config, the task and its prompts. Evaluation
has no record of its own: it reads generation's, the checker and the held-out prompts, no more.
``Learner`` stays one record: the update is one phase and reads all of it."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from grpo.config import TrainConfig
    from grpo.rewards.combine import RewardScorer
    from grpo.sampling.episodes import Agent
    from grpo.sampling.prompt_samplers import DrawCounts, FrontierSampler, UniformSampler
    from grpo.sampling.screen import Screen
    from grpo.sampling.tools import ToolBox
    from grpo.sampling.vllm_engine import VLLMEngine
    from grpo.system.distributed import ModelCalls, World
    from grpo.tasks import Task


@dataclass
class Temperature:
    """The temperature the next step samples and trains at: the configuration's, or under temperature_target
    the run's adapted one (its state, kept in checkpoints by grpo/run/run_state.py; the configuration keeps the
    resolved --temperature, the start). One object, shared by both sides, so the update scores at the
    temperature the sampler drew at."""

    value: float


@dataclass
class Generation:
    """What generating completions reads: the policy and how it runs. A round's groups, the screen's prefill
    and probes, the evaluations and the pre-flight's samples all read it."""

    world: World  # this process's place among the processes (one, or torchrun's)
    device: torch.device
    tokenizer: object
    model: nn.Module  # the policy's module, put in eval mode to sample (sampling ahead: its own copy)
    policy: ModelCalls  # calls of the model that FSDP can see
    autocast: AbstractContextManager
    temperature: Temperature  # the next step's (temperature_target adapts it; the config's is the start)
    agent: Agent | None  # None: single-turn
    toolbox: ToolBox | None  # the agent's tool workers
    engine: VLLMEngine | None  # None: the own sampler, on the policy itself


@dataclass
class Scoring:
    """What scoring completions reads."""

    score: RewardScorer  # the rewards, in worker processes with a time limit
    checker: RewardScorer  # the task's checker, the same way (the scorer itself when the checker is the reward)
    reward_fns: list[Callable]


@dataclass
class Drawing:
    """What drawing a round's prompts reads and changes: stateful, shared by reference with every copy."""

    sampler: UniformSampler | FrontierSampler | None = None  # which prompts next (None: the pre-flight check's side)
    draws: DrawCounts | None = None  # which groups are a first try at their prompt (None: as the sampler)
    screen: Screen | None = None  # which candidates get a group (grpo/sampling/screen.py); None: the sampler's draw as it is


@dataclass
class Sampling:
    """What generating a batch, scoring it and evaluating read: the task and its prompts, and a record for
    each phase. The stateful parts (sampler, draws, screen, scorer) are shared by reference with every copy."""

    config: TrainConfig
    task: Task
    train_prompts: list[list[int]]  # the task's rows as prompt tokens
    heldout_prompts: list[list[int]]
    generation: Generation
    scoring: Scoring
    drawing: Drawing


@dataclass
class Learner:
    """What the update reads and changes: the policy's weights and the optimiser's state."""

    config: TrainConfig
    world: World
    model: nn.Module  # the policy's module (LoRA-wrapped when asked)
    policy: ModelCalls
    reference: ModelCalls | None  # the frozen reference for the KL term; None: beta = 0, or LoRA's base weights
    optimizer: torch.optim.Optimizer
    tokenizer: object  # its pad id pads the micro-batches
    autocast: AbstractContextManager
    order_rng: random.Random  # the minibatches' order (the prompt sampler's RNG, unless sampling runs ahead)
    temperature: Temperature  # the sampler's (the same object as Sampling's)
    teacher: nn.Module | None = None  # the frozen teacher of on-policy distillation (grpo/learning/teacher/); None: none
