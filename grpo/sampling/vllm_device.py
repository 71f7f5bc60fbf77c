"""What vLLM gets of the machine: its share of a GPU, the dtype it samples in, and room in /dev/shm.

With ``--vllm-memory 0`` (the default) its share of a GPU is sized for the run: its 16-bit weights, the
KV cache of the process's share of a generation round, and an allowance for vLLM's own working memory.
The GPU computes in bf16 from compute capability 8.0 (vLLM refuses bf16 on a T4 or V100: fp16 there).
The weights vLLM loads and the push buffer live in /dev/shm, which is memory: its free space is checked
before anything is written there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# vLLM's working memory on a GPU beside its weights and KV cache (its profiling pass's activations, CUDA
# graphs, its context): an allowance, not measured; its share of a GPU is at most VLLM_MAX_SHARE.
VLLM_GPU_ALLOWANCE = 2 * 1024**3
VLLM_MAX_SHARE = 0.9
VLLM_CPU_SHARE = 0.1  # vllm_memory 0 on the CPU backend: this share of host memory for its KV cache


class EngineError(RuntimeError):
    """The vLLM engine could not start or failed; the message is one line that says what to do."""


def vllm_gpu_bytes(model: object, rows: int, tokens: int) -> int:
    """What vLLM needs on a GPU to sample a round (``model``: a grpo.run.memory_shapes.ModelShape): its 16-bit
    weights (2 P), the KV cache of ``rows`` sequences of ``tokens`` (16-bit: rows x tokens x 2 x L x KV
    heads x head_dim x 2), and VLLM_GPU_ALLOWANCE."""
    return 2 * model.params + rows * tokens * model.kv_bytes_per_token(2) + VLLM_GPU_ALLOWANCE


def vllm_share(model: object, rows: int, tokens: int, device: object, given: float = 0.0) -> float:
    """vLLM's share of the device (its gpu_memory_utilization): ``given`` (--vllm-memory), else on a GPU
    what a round needs (vllm_gpu_bytes) over the GPU's memory, at most VLLM_MAX_SHARE; on the CPU
    backend VLLM_CPU_SHARE of host memory."""
    if given:
        return given
    if device.kind != "cuda" or not device.total:
        return VLLM_CPU_SHARE
    return min(VLLM_MAX_SHARE, vllm_gpu_bytes(model, rows, tokens) / device.total)


def engine_dtype(device: torch.device) -> str:
    """vLLM's dtype on ``device``: bf16 on a GPU that computes it (compute capability 8.0 and up), else
    fp16 there; fp32 on the CPU backend."""
    import torch  # here: grpo/run/memory.py reads this module's sizes without torch

    if device.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability(device) >= (8, 0) else "float16"


def check_room(folder: Path, need: int, what: str) -> None:
    """EngineError, one line, when the file system of ``folder`` (/dev/shm: memory) has less than ``need``
    bytes free for ``what``: a tmpfs that fills up ends the writer with SIGBUS or a short write."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise EngineError(f"--engine vllm: {folder.parent} has {free / 2**30:.1f} GiB free, and {what} need "
                          f"{need / 2**30:.1f} GiB there; free shared memory or enlarge it (a container's "
                          "--shm-size)")
