"""The weights as vLLM reads them: the model folder it starts from (config.json and one safetensors file), and
the buckets a full push sends through the shared-memory buffer, each block of the model whole."""

from __future__ import annotations

import re
from pathlib import Path

from torch import Tensor, nn


def _distinct(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every name with a tensor of its own: safetensors refuses shared storage, so a tied weight (lm_head and
    the embeddings) is written under each name; vLLM's CPU backend keeps a repacked lm_head of its own."""
    seen, out = set(), {}
    for name, value in state.items():
        key = (value.data_ptr(), value.shape)
        value = value.detach().to("cpu")
        out[name] = value.clone() if key in seen else value.contiguous()
        seen.add(key)
    return out


def _write_model(folder: Path, model: nn.Module, state: dict[str, Tensor]) -> None:
    """The folder vLLM loads: config.json and the weights in one safetensors file.

    Written here rather than by ``save_pretrained``, which writes on rank 0
    alone once torch.distributed is up, while under torchrun every process
    starts an engine of its own. The architecture is the model's class when
    the config does not say (a model built from a config).
    """
    import copy

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = config.architectures or [type(model).__name__]
    config.to_json_file(folder / "config.json", use_diff=False)
    if getattr(model, "generation_config", None) is not None:  # as save_pretrained writes it
        model.generation_config.to_json_file(folder / "generation_config.json")
    save_file(_distinct(state), str(folder / "model.safetensors"), metadata={"format": "pt"})


def weight_buckets(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """The weights' names in buckets of at most ``limit`` bytes, in order; a block's weights (a decoder
    layer, ``...layers.N.``) always share a bucket, one larger than ``limit`` alone: vLLM loads a module's
    fused weights (q, k and v into one; a layer's experts) only once it has all of them, and a module half
    loaded would be filled from uninitialised memory, so a block never straddles two loads."""
    units: dict[str, list[str]] = {}  # by block, in the order of each block's first weight
    for name in sizes:
        # a block: the name up to its first numbered part (model.layers.3, transformer.h.3, visual.blocks.3;
        # a mixture of experts' experts with their layer, fused by vLLM); outside blocks, a module's weights
        match = re.match(r"(.*?\.\d+)\.", name)
        units.setdefault(match.group(1) if match else name.rpartition(".")[0], []).append(name)
    buckets: list[list[str]] = []
    used = 0
    for unit in units.values():
        n = sum(sizes[k] for k in unit)
        if buckets and used + n <= limit:
            buckets[-1] += unit
            used += n
        else:
            buckets.append(list(unit))
            used = n
    return buckets
