"""The full-weight push to vLLM (``--engine vllm``): seconds, bytes copied and shared memory held per push.

Starts a vLLM engine on the embedded SmolLM2-135M (fp32 on the CPU), then
``--pushes`` times: nudges every weight (so each push carries new values),
pushes, and times it. While a push runs, a thread polls the engine's
shared-memory folder and keeps the largest total size it saw: what the push
staged there (a whole safetensors file per push before the bucketed push; one
bucket's buffer, kept for the run, after). Last, the engine scores two fixed
completions and the trainer's own log-probs are compared with them: a push that
is fast but wrong fails here.

    .venv/bin/python bench/bench_push.py [--pushes 5] [--bucket-mb 256]

It runs against whatever ``grpo`` is on the path, so the same script measures
an older commit from a worktree (``PYTHONPATH=/path/to/worktree``). Prints a
table and one JSON line.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from grpo.learning.logprobs import rollout_logprobs
from grpo.models import load_policy
from grpo.sampling.rollout import Rollout
from grpo.sampling.vllm_engine import VLLMEngine


def folder_bytes(folder: Path, skip: set[str]) -> int:
    total = 0
    for p in folder.iterdir():
        try:
            if p.name not in skip and p.is_file():
                total += p.stat().st_size
        except FileNotFoundError:  # written and removed between the listing and the stat
            pass
    return total


class PeakWatcher(threading.Thread):
    """The largest total size of the engine's shared-memory files seen while it runs (every 2 ms)."""

    def __init__(self, folder: Path, skip: set[str]) -> None:
        super().__init__(daemon=True)
        self.folder, self.skip, self.peak, self.running = folder, skip, 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, folder_bytes(self.folder, self.skip))
            time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=1024.0, help="the bucketed push's buffer (ignored before it)")
    parser.add_argument("--vllm-memory", type=float, default=0.1)
    args = parser.parse_args()

    torch.manual_seed(0)
    policy = load_policy("smollm2", device="cpu")
    model, tokenizer = policy.model, policy.tokenizer
    kwargs = {"memory": args.vllm_memory, "max_model_len": 512}
    if "bucket_mb" in inspect.signature(VLLMEngine).parameters:
        kwargs["bucket_mb"] = args.bucket_mb
    engine = VLLMEngine(model, tokenizer, **kwargs)
    engine.start()
    skip = {"socket"} | {p.name for p in engine.dir.iterdir() if p.is_dir()}  # the model folder vLLM started from
    seconds, peaks = [], []
    for _ in range(args.pushes):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=1e-3)
        watcher = PeakWatcher(engine.dir, skip)
        watcher.start()
        seconds.append(engine.push(model))
        watcher.running = False
        watcher.join()
        peaks.append(watcher.peak)

    prompt = tokenizer.encode("What is 23 + 45?", add_special_tokens=False)
    completion = tokenizer.encode(" The answer is 68.", add_special_tokens=False)
    engine_logp = engine.score([prompt], [completion])[0]
    r = Rollout(prompt_ids=[prompt], completion_ids=torch.tensor([completion]), mask=torch.ones(1, len(completion)),
                logprobs=torch.zeros(1, len(completion)), truncated=torch.zeros(1, dtype=torch.bool), texts=[""],
                group_size=1)
    with torch.no_grad():
        trainer_logp = rollout_logprobs(model, r, tokenizer.pad_token_id, temperature=1.0)[0][0]
    gap = float((engine_logp - trainer_logp).abs().max())
    weight_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    engine.close()

    result = {
        "push_seconds_median": round(statistics.median(seconds), 3), "push_seconds_min": round(min(seconds), 3),
        "push_seconds_max": round(max(seconds), 3), "pushes": len(seconds),
        "shared_memory_peak_mb": round(max(peaks) / 2**20, 1), "weights_mb": round(weight_bytes / 2**20, 1),
        "bytes_copied_per_push_mb": round(getattr(engine, "pushed_bytes", 0) / 2**20, 1) or None,
        "engine_vs_trainer_logp_max_diff": gap, "torch_threads": torch.get_num_threads(),
    }
    print(f"push seconds: median {result['push_seconds_median']}, min {result['push_seconds_min']}, "
          f"max {result['push_seconds_max']} ({len(seconds)} pushes)")
    print(f"shared memory staged (peak): {result['shared_memory_peak_mb']} MiB; weights {result['weights_mb']} MiB")
    print(f"engine vs trainer log-prob, max |diff| after the last push: {gap:.2e}")
    print(json.dumps(result))
    if gap > 1e-3:
        raise SystemExit(f"the engine does not hold the trainer's weights after the push (max |diff| {gap:.2e})")


if __name__ == "__main__":  # vLLM's worker starts its own processes by spawn
    main()
