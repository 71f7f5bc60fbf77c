"""Sampling ahead on this CPU: `grpo train --engine vllm --async-lag K` for K = 0, 1, 2, one run after another.

    python bench/bench_async.py [--minutes 6] [--lags 0 1 2] [--keep DIR] [-- extra grpo train options]

vLLM's CPU threads are bound to core 0 (VLLM_CPU_OMP_THREADS_BIND=0) and the trainer computes with one thread
(--threads 1), so that with K >= 1 the engine samples the next batch on one core while the update runs on
the other. Every run gets the same training-time budget (--minutes) on the built-in `add` task, so the
held-out accuracy at its end compares the lags at equal time. Printed per run: steps done, mean seconds per
step (step 1 left out: it starts vLLM), the phases (time_generate and time_update; with K >= 1 the trainer's
wait for a batch and the sampler's for weights), held-out accuracy at the start and the end.

The comparison the issue asks for is in one line at the end: seconds per step with K = 1 against
time_generate + time_update of the K = 0 run. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gemm_peak(threads: int) -> float:
    """fp32 GFLOP/s of a 2048^3 matmul on ``threads`` threads, best of 8: the machine's speed beside the figures."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(2048, 2048)
    best = math.inf
    for _ in range(8):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048**3 / best / 1e9


def run(lag: int, minutes: float, out: Path, extra: list[str]) -> dict:
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "grpo", "train", "--task", "add", "--engine", "vllm", "--threads", "1",
           "--async-lag", str(lag), "--minutes", str(minutes), "--steps", "200", "--eval-size", "128",
           "--seed", "0", "--no-progress", "--output", str(out), "--no-save-model", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"K={lag} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r and r["step"] > 1]
    summary = json.loads((out / "summary.json").read_text())

    def mean(key: str) -> float:
        values = [r[key] for r in steps if key in r]
        return sum(values) / len(values) if values else float("nan")

    return {"K": lag, "steps": summary["steps"], "wall_s": time.perf_counter() - t0,
            "train_s": summary["train_seconds"], "step_s": mean("time_step"), "generate_s": mean("time_generate"),
            "update_s": mean("time_update"), "sync_s": mean("time_sync"), "wait_sampler_s": mean("time_wait_sampler"),
            "wait_trainer_s": mean("time_wait_trainer"), "start": summary["heldout_accuracy_start"],
            "end": summary["heldout_accuracy_end"], "alarms": summary["alarms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("extra", nargs="*", help="more grpo train options, after --")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-async-"))
    print(f"fp32 GEMM peak: {gemm_peak(1):.0f} GFLOP/s on one thread, {gemm_peak(os.cpu_count() or 1):.0f} on all "
          "(2048^3 matmul, best of 8)", flush=True)
    results = []
    for lag in args.lags:
        results.append(run(lag, args.minutes, root / f"k{lag}", args.extra))
        r = results[-1]
        print(f"K={lag}: {r['steps']} steps in {r['train_s']:.0f} s of training ({r['wall_s']:.0f} s wall); per step "
              f"(steps 2+): {r['step_s']:.1f} s = generate {r['generate_s']:.1f}, update {r['update_s']:.1f}, "
              f"sync {r['sync_s']:.1f}, trainer waited {r['wait_sampler_s']:.1f}, sampler waited "
              f"{r['wait_trainer_s']:.1f}; held-out {r['start']:.1%} -> {r['end']:.1%}; alarms {r['alarms'] or 'none'}",
              flush=True)
    by = {r["K"]: r for r in results}
    if 0 in by and 1 in by:
        serial = by[0]["generate_s"] + by[0]["update_s"]
        print(f"K=1 seconds per step {by[1]['step_s']:.1f} vs K=0 time_generate + time_update {serial:.1f} "
              f"({by[0]['step_s']:.1f} per step with its sync): ratio {by[1]['step_s'] / serial:.2f}")
    print(f"runs in {root}")


if __name__ == "__main__":
    main()
