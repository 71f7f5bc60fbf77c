"""What one checkpointed decoder layer's backward holds at once (docs/memory.md, "Long completions").

    CKPT=1 python bench/checkpoint_layer_probe.py   # layer 0 of SmolLM2-135M, 24 rows of 128 tokens
    python bench/checkpoint_layer_probe.py          # the same layer without checkpointing
    R=8 T=64 CKPT=1 python bench/checkpoint_layer_probe.py

Prints, in MiB of the resident set, what the forward kept, its peak and the backward's peak above what
was held before it, and that peak in units of one layer's set as grpo/run/memory.py counts it
(tokens x ``activation_floats_per_token`` x 4 bytes). Random inputs; no KV cache, no prompt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def status(key: str) -> float:
    """A /proc/self/status figure in MiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 2**10
    return float("nan")


def main() -> None:
    from grpo.config import TrainConfig
    from grpo.models import load_policy
    from grpo.run.memory_shapes import ModelShape
    from grpo.run.process_setup import setup_process
    from grpo.sampling.forward import grouped_kv_attention

    setup_process(TrainConfig())  # the allocator setting a run uses
    model = load_policy("smollm2").model
    decoder = model.get_decoder()
    layer = decoder.layers[0]
    rows, t, ckpt = int(os.environ.get("R", 24)), int(os.environ.get("T", 128)), os.environ.get("CKPT") == "1"
    torch.manual_seed(0)
    x = torch.randn(rows, t, model.config.hidden_size, requires_grad=True)
    pos = torch.arange(t).unsqueeze(0).expand(rows, t)
    rotary = decoder.rotary_emb(x, pos)

    def run(h: torch.Tensor) -> torch.Tensor:
        out = layer(h, attention_mask=None, position_ids=pos, position_embeddings=rotary)
        return out[0] if isinstance(out, tuple) else out

    with grouped_kv_attention(x.device):
        with torch.no_grad():
            run(x.detach())  # first use pages the weights in
        Path("/proc/self/clear_refs").write_text("5")
        before = status("VmRSS")
        y = checkpoint(run, x, use_reentrant=False) if ckpt else run(x)
        kept, forward_peak = status("VmRSS"), status("VmHWM")
        Path("/proc/self/clear_refs").write_text("5")
        y.backward(torch.ones_like(y))
        backward_peak = status("VmHWM")
    one_set = rows * t * ModelShape.from_config(model.config).activation_floats_per_token() * 4 / 2**20
    print(f"rows {rows} x {t} tokens, checkpointing {ckpt}: one layer's set counted {one_set:.0f} MiB; "
          f"forward kept {kept - before:.0f}, peaked {forward_peak - before:.0f}; backward peaked "
          f"{backward_peak - kept:.0f} MiB above what it held before ({(backward_peak - kept) / one_set:.2f} sets)")


if __name__ == "__main__":
    main()
