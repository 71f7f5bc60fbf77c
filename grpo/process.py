"""What a training process sets for itself before a trainer is built: seeds, threads, the allocator.

These are global to the process, so no library constructor touches them: the CLI and
:func:`grpo.train` call :func:`setup_process` once, and a user building a
:class:`grpo.trainer.GRPOTrainer` by hand calls it first.
"""

from __future__ import annotations

import ctypes
import random
import sys

import numpy as np
import torch

from grpo.config import TrainConfig


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


def release_freed_memory(mib: int) -> None:
    """Have glibc return freed blocks of at least ``mib`` MiB to the system at once.

    By default glibc raises that threshold as blocks are freed, up to 32 MiB,
    and keeps smaller freed blocks for reuse; a training step frees and
    allocates activations of many sizes, so the kept blocks fragment and add
    hundreds of MB to the peak. A no-op off Linux or without glibc.
    """
    if mib <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, mib << 20)  # M_MMAP_THRESHOLD; setting it also stops glibc adjusting it
