"""What a training process sets for itself before a trainer is built: seeds, threads, the allocator.

These are global to the process, so no library constructor touches them: the CLI and
:func:`grpo.train` call :func:`setup_process` once, and a user building a
:class:`grpo.run.trainer.GRPOTrainer` by hand calls it first.
"""

from __future__ import annotations

import random
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

from grpo.config import TrainConfig
from grpo.system.heap_settings import release_freed_memory


def setup_process(config: TrainConfig) -> None:
    """Seed Python, NumPy and torch from ``config.seed``; set glibc's heap release and torch's threads."""
    seed_everything(config.seed)
    release_freed_memory(config.heap_release_mb)
    if config.threads:
        torch.set_num_threads(config.threads)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def gpu_autocast(device: torch.device) -> AbstractContextManager:
    """bf16 matrix products on a GPU, as the trainer samples, evaluates and trains; nothing on a CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
