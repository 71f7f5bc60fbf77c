"""The combinations of options that are not built, refused in one line before anything loads.

Each refusal depends only on the options, the number of processes and whether the run trains an
adapter (``--lora-rank``, or an adapter folder as ``--model``: ``grpo.models.is_adapter_folder``, a file
check). ``grpo train`` asks before it launches processes or reads a weight (grpo/cli/train.py); the
trainer's constructor asks again first thing, for the Python API, where the model may come as an object.
"""

from __future__ import annotations

import os

from grpo.config import ConfigError, TrainConfig

ASYNC_TORCHRUN = "async_lag under torchrun is not built: sample ahead with one process, or drop --async-lag"
ASYNC_VLLM_LORA = ("async_lag with --engine vllm and LoRA is not built: use the own engine, or full fine-tuning "
                   "(LoRA: --lora-rank, or an adapter folder as --model)")
VLLM_FSDP_LORA = ("engine vllm with LoRA under FSDP is not built: drop --fsdp (each process holds the whole model; "
                  "LoRA: --lora-rank, or an adapter folder as --model)")

TURNS_NEED_CHAT = ("prompt format {fmt} writes one question and one answer; episodes with tools or an environment "
                   "take turns, which need a chat template: a model that has one, or --chat-template FILE")


def world_size(nproc: int = 1) -> int:
    """The number of processes the run has: torchrun's WORLD_SIZE inside a launched process, else ``nproc``
    (what ``grpo train --nproc`` is about to launch)."""
    return int(os.environ.get("WORLD_SIZE", nproc))


def config_trains_adapter(config: TrainConfig) -> bool:
    """Whether the run will train an adapter, known before the model loads."""
    from grpo.models import is_adapter_folder

    return config.lora_rank > 0 or is_adapter_folder(config.model)


def refuse_unbuilt(config: TrainConfig, processes: int, *, adapter: bool) -> None:
    """Raise ConfigError, naming the options, for a combination that is not built."""
    if config.prompt_format in ("plain", "r1-zero") and (config.env or config.tools not in ("", "none")):
        # a task's own tools are known once it loads: grpo.episodes.make_agent refuses those
        raise ConfigError(TURNS_NEED_CHAT.format(fmt=config.prompt_format))
    if config.async_lag and processes > 1:
        raise ConfigError(ASYNC_TORCHRUN)
    if config.engine == "vllm" and adapter and config.async_lag:
        raise ConfigError(ASYNC_VLLM_LORA)
    if config.engine == "vllm" and adapter and config.fsdp and processes > 1:
        raise ConfigError(VLLM_FSDP_LORA)
