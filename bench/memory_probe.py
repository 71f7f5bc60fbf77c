"""Peak resident memory of one forward and backward through grpo's log-prob path (docs/memory.md).

    B=8 python bench/memory_probe.py      # 8 groups of 8 rows: 45 prompt + 12 completion tokens each
    B=16 python bench/memory_probe.py     # twice the tokens: the difference is the activations a token
    CKPT=1 B=8 python bench/memory_probe.py   # with gradient checkpointing
    CKPT=1 B=3 T=128 python bench/memory_probe.py   # long completions: a micro-batch of --max-new-tokens 128

Prints VmHWM (the kernel's peak resident set, GiB) after the imports, the load of the embedded model,
the forward and the backward, the peak reset between them. Random tokens; the weights are SmolLM2-135M's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    from grpo.config import TrainConfig
    from grpo.learning.logprobs import rollout_logprobs
    from grpo.models import load_policy
    from grpo.run.process_setup import setup_process
    from grpo.sampling.rollout import Rollout

    setup_process(TrainConfig())  # the allocator setting a run uses
    print("imports", status("VmHWM"), flush=True)
    Path("/proc/self/clear_refs").write_text("5")
    policy = load_policy("smollm2")
    print("load", status("VmHWM"), "rss", status("VmRSS"), flush=True)
    b, g, p, t = int(os.environ.get("B", 8)), 8, 45, int(os.environ.get("T", 12))
    torch.manual_seed(0)
    prompts = [torch.randint(100, 1000, (p,)).tolist() for _ in range(b)]
    rollout = Rollout(prompt_ids=prompts, completion_ids=torch.randint(100, 1000, (b * g, t)),
                      mask=torch.ones(b * g, t), logprobs=torch.zeros(b * g, t),
                      truncated=torch.zeros(b * g, dtype=torch.bool), texts=[""] * (b * g), group_size=g)
    ckpt = os.environ.get("CKPT") == "1"  # gradient checkpointing, as --gradient-checkpointing trains
    logp, _ = rollout_logprobs(policy.model, rollout, 0, temperature=0.7, checkpoint_layers=ckpt)
    print("forward", status("VmHWM"), "rss", status("VmRSS"), flush=True)
    logp.sum().backward()
    print("backward", status("VmHWM"), "rss", status("VmRSS"), flush=True)


if __name__ == "__main__":
    main()
