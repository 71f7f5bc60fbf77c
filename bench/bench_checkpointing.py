"""Gradient checkpointing (--gradient-checkpointing): the training pass's peak memory and time, with and without.

The workload is one micro-batch of the training pass on the embedded SmolLM2-135M: ``--prompts`` prompts of
the ``add`` task, ``--group-size`` completions each of ``--tokens`` random tokens (every row at full length,
as a rambling batch would be), forward and backward (``rollout_logprobs``, then the summed log-probs'
gradient). Each way runs in a fresh process. A first pass, not counted, pages the weights in and allocates
the gradients (kept, as across micro-batches); before each counted pass freed memory goes back to the
system (malloc_trim) and the peak resident set (VmHWM) is reset, so "peak above start" is what the pass
itself holds at most: activations kept for backward, and the temporaries of both directions. The best of
``--repeats`` counted passes gives the time. Prints a table and, last, one JSON line with the ratios.

    .venv/bin/python bench/bench_checkpointing.py                 # 4 prompts x 8 x 256 tokens
    .venv/bin/python bench/bench_checkpointing.py --tokens 32 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def peak_rss() -> int:
    """The process's peak resident set since the last reset, in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def one_way(args: argparse.Namespace) -> dict:
    """In this process: the pass ``args.repeats`` times, checkpointing as ``args.checkpointing`` says."""
    from grpo.learning.logprobs import rollout_logprobs
    from grpo.models import load_policy
    from grpo.sampling.prompts import encode_prompts
    from grpo.sampling.rollout import Rollout
    from grpo.tasks import get_task

    torch.set_num_threads(args.threads)
    policy = load_policy("smollm2")
    model, tokenizer = policy.model.train(), policy.tokenizer
    rows = list(get_task("add", heldout_size=16).train)[: args.prompts]
    prompts = encode_prompts(tokenizer, [[{"role": "user", "content": r["prompt"]}] for r in rows])
    n = args.prompts * args.group_size
    ids = torch.randint(100, len(tokenizer) - 100, (n, args.tokens), generator=torch.Generator().manual_seed(0))
    rollout = Rollout(prompt_ids=prompts, completion_ids=ids, mask=torch.ones(n, args.tokens),
                      logprobs=torch.zeros(n, args.tokens), truncated=torch.ones(n, dtype=torch.bool),
                      texts=[""] * n, group_size=args.group_size)
    libc = ctypes.CDLL("libc.so.6")
    seconds, peaks = [], []
    for repeat in range(args.repeats + 1):  # the first pass pages the weights in and makes the gradients
        gc.collect()
        libc.malloc_trim(0)  # freed blocks back to the system, so that the resident set is what is live
        base = current_rss()
        Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
        start = time.perf_counter()
        logp, _ = rollout_logprobs(model, rollout, tokenizer.pad_token_id, checkpoint_layers=args.checkpointing)
        (logp * rollout.mask).sum().backward()  # into the gradients kept from the first pass, as micro-batches do
        if repeat:
            seconds.append(time.perf_counter() - start)
            peaks.append(peak_rss() - base)
        del logp
    return {"seconds": min(seconds), "peak_bytes": max(peaks), "tokens": n * args.tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=["off", "on"], help=argparse.SUPPRESS)  # a child process: one way
    args = parser.parse_args()
    if args.one:
        args.checkpointing = args.one == "on"
        print(json.dumps(one_way(args)))
        return 0
    results = {}
    for way in ("off", "on"):
        cmd = [sys.executable, __file__, "--one", way, *sys.argv[1:]]
        # a fixed mmap threshold: blocks of 64 kB and more are mapped and unmapped as they are allocated and
        # freed (glibc's threshold otherwise grows after frees and keeps freed blocks resident), so the
        # resident set follows what is live
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[way] = json.loads(proc.stdout.strip().splitlines()[-1])
    tokens = results["off"]["tokens"]
    print(f"training pass: {args.prompts} prompts x {args.group_size} x {args.tokens} tokens ({tokens} tokens), "
          f"embedded SmolLM2-135M, {args.threads} threads, best of {args.repeats}")
    print(f"{'checkpointing':<14} {'seconds':>8} {'peak MB above start':>20}")
    for way in ("off", "on"):
        r = results[way]
        print(f"{way:<14} {r['seconds']:>8.2f} {r['peak_bytes'] / 2**20:>20.0f}")
    ratios = {"memory_ratio": results["on"]["peak_bytes"] / results["off"]["peak_bytes"],
              "time_ratio": results["on"]["seconds"] / results["off"]["seconds"]}
    print(json.dumps({**ratios, "off": results["off"], "on": results["on"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
