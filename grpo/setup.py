"""Building a run's parts, in the order they depend on each other: the rewards' scorer, the policy (loaded,
LoRA-wrapped, sharded) with its reference and optimiser, the vLLM engine. grpo/trainer.py calls these once;
each takes what it reads and returns what it built."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from grpo.config import DATA_MAX_NEW_TOKENS, TrainConfig
from grpo.distributed import Policy, World, full_state_dict, shard_policy
from grpo.episodes import Agent
from grpo.models import add_lora, load_policy, trains_adapter
from grpo.rewards import RewardScorer, combine_rewards, resolve_reward
from grpo.rewards.sandbox import check_sandbox, needs_sandbox, set_sandbox
from grpo.rewards.styles import check_style
from grpo.tasks import Task
from grpo.vllm_engine import VLLMEngine, cpu_share

RewardFn = Callable[[str, Mapping], float]
EPISODE_OPENING_TOKENS = 1024  # --engine vllm: what an episode's opening may add to the task's prompt


def build_scorer(config: TrainConfig, task: Task, rewards: Sequence[RewardFn | str] | None
                 ) -> tuple[list[Callable], RewardScorer, RewardScorer]:
    """The reward functions, the scorer that runs them (in worker processes, with a time limit), and the
    task's checker, for held-out accuracy, pre-flight and the step's accuracy: in workers with the same
    time limit (the reward's own scorer when the checker is the reward)."""
    reward_specs = list(rewards) if rewards is not None else list(config.rewards)
    reward_fns = [resolve_reward(r) for r in reward_specs] or [task.reward]
    # process-wide, before the reward workers fork, so they inherit it
    if needs_sandbox([*reward_fns, *([task.env] if task.env else [])]):
        set_sandbox(check_sandbox(config.sandbox))
    weights = config.reward_weights or (1.0,) * len(reward_fns)
    style = config.reward_style if reward_specs else "auto"
    score = combine_rewards(
        reward_fns, weights, workers=config.reward_workers, timeout=config.reward_timeout,
        on_error=config.on_error, max_completion_tokens=config.max_new_tokens,
        styles=[check_style(fn, style) for fn in reward_fns],
    )
    checker = score if reward_fns == [task.reward] and not config.reward_weights else \
        combine_rewards([task.reward], workers=config.reward_workers, timeout=config.reward_timeout)
    return reward_fns, score, checker


def load_model(config: TrainConfig, device: torch.device, model: nn.Module | None, tokenizer: object | None
               ) -> tuple[nn.Module, object]:
    """The model and tokenizer given, or those the config names; the tokenizer pads with EOS if it has no pad."""
    if model is None:
        loaded = load_policy(config.model, device=device)
        model, tokenizer = loaded.model, loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_policy(config: TrainConfig, world: World, device: torch.device, model: nn.Module
                 ) -> tuple[nn.Module, Policy, Policy | None, torch.optim.Optimizer]:
    """The policy's module (on the device, LoRA-wrapped when asked, the same on every process), its calls
    that FSDP can see, the frozen reference for the KL term, and the optimiser."""
    model.to(device)
    if config.lora_rank > 0:
        model = add_lora(model, config.lora_rank, config.lora_alpha or None)
    world.broadcast_parameters(model)
    reference = reference_model(config, world, model)
    policy = shard_policy(model, world)  # calls of the model that FSDP can see
    params = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel updates in place, with none of the foreach path's parameter-sized temporaries
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay,
                                  fused=None if config.fsdp else True)
    return model, policy, reference, optimizer


def reference_model(config: TrainConfig, world: World, model: nn.Module) -> Policy | None:
    """The frozen reference for the KL term (sharded as the policy is); none when beta = 0.
    LoRA reuses the base weights."""
    if config.beta == 0.0 or trains_adapter(model):
        return None
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return shard_policy(ref, world)


def build_engine(config: TrainConfig, world: World, device: torch.device, model: nn.Module, tokenizer: object,
                 agent: Agent | None, train_prompts: list[list[int]]) -> VLLMEngine | None:
    """The vLLM engine for ``engine="vllm"`` (started at the first rollout); None for the own sampler."""
    if config.engine == "own":
        return None
    # room for the longest prompt and the longest completion any setting may ask for; an episode's
    # opening may add to the prompt (a tool list in the system message): room for that too
    after = config.max_episode_tokens + EPISODE_OPENING_TOKENS if agent is not None else 0
    longest = max(len(p) for p in train_prompts) + max(config.max_new_tokens, DATA_MAX_NEW_TOKENS, after)
    # each process samples its own groups with an engine of its own, on its own device (or share of cores)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cpus = cpu_share(world.local_rank, local, os.cpu_count() or 1) if local > 1 else ""
    engine = VLLMEngine(model, tokenizer, python=config.vllm_python, memory=config.vllm_memory,
                        seed=config.seed, max_model_len=longest, cpus=cpus,
                        sleep=config.vllm_sleep and device.type == "cuda" and not config.async_lag,
                        bucket_mb=config.vllm_bucket_mb)  # sampling ahead: vLLM works while the policy trains
    if world.fsdp:  # the weights vLLM starts from, gathered now (collective): every process is here
        engine.push(model, full_state_dict(model, world))
    return engine
