"""The combinations of options that are not built, refused in one line before anything loads.

Each refusal depends only on the options, the number of processes and whether the run trains an
adapter (``--lora-rank``, or an adapter folder as ``--model``: ``grpo.models.is_adapter_folder``, a file
check). ``grpo train`` asks before it launches processes or reads a weight (grpo/cli/train.py); the
trainer's constructor asks again first thing, for the Python API, where the model may come as an object.
"""

from __future__ import annotations

import os

from grpo.config import ConfigError, TrainConfig
from grpo.models import is_adapter_folder

ASYNC_TORCHRUN = "async_lag under torchrun is not built: sample ahead with one process, or drop --async-lag"
ASYNC_VLLM_LORA = ("async_lag with --engine vllm and LoRA is not built: use the own engine, or full fine-tuning "
                   "(LoRA: --lora-rank, or an adapter folder as --model)")
VLLM_FSDP_LORA = ("engine vllm with LoRA under FSDP is not built: drop --fsdp (each process holds the whole model; "
                  "LoRA: --lora-rank, or an adapter folder as --model)")

ADAPTER_AND_LORA = ("the model is a LoRA adapter already (an adapter folder as --model trains it on): "
                    "drop --lora-rank")
NO_CHAT_TEMPLATE = ("prompt_format chat: the model's tokenizer has no chat template; use --prompt-format "
                    "plain or r1-zero (base models), or give --chat-template FILE")
TURNS_NEED_CHAT = ("prompt format {fmt} writes one question and one answer; episodes with tools or an environment "
                   "take turns, which need a chat template: a model that has one, or --chat-template FILE")


def world_size(nproc: int = 1) -> int:
    """The number of processes the run has: torchrun's WORLD_SIZE inside a launched process, else ``nproc``
    (what ``grpo train --nproc`` is about to launch)."""
    return int(os.environ.get("WORLD_SIZE", nproc))


def config_trains_adapter(config: TrainConfig) -> bool:
    """Whether the run will train an adapter, known before the model loads."""
    return config.lora_rank > 0 or is_adapter_folder(config.model)


def refuse_unbuilt(config: TrainConfig, processes: int, *, adapter: bool, turns: bool = False,
                   chat: bool | None = None) -> None:
    """Raise ConfigError, naming the options, for a combination that is not built. ``turns``: the episodes
    take turns (tools or an environment, the task's own included); ``chat``: whether the model's files hold
    a chat template (None: they do not tell before loading; the trainer's format then decides)."""
    chat = True if config.chat_template else chat
    fmt = "plain" if config.prompt_format == "auto" and chat is False else config.prompt_format
    if fmt in ("plain", "r1-zero") and (turns or config.env or config.tools not in ("", "none")):
        raise ConfigError(TURNS_NEED_CHAT.format(fmt=fmt))
    if fmt == "chat" and chat is False:
        raise ConfigError(NO_CHAT_TEMPLATE)
    if config.lora_rank > 0 and is_adapter_folder(config.model):
        raise ConfigError(ADAPTER_AND_LORA)
    if config.async_lag and processes > 1:
        raise ConfigError(ASYNC_TORCHRUN)
    if config.engine == "vllm" and adapter and config.async_lag:
        raise ConfigError(ASYNC_VLLM_LORA)
    if config.engine == "vllm" and adapter and config.fsdp and processes > 1:
        raise ConfigError(VLLM_FSDP_LORA)
