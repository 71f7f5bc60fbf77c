"""What one generated token costs: the own engine against transformers' ``generate`` at a fixed batch.

bench_vs_trl.py's rollout tokens/s divides each side's sampled tokens by its
generation time; both sides decode until the longest completion of the step
ends (48 tokens in most steps), so that figure moves with the lengths each
side happened to sample. Here every row runs exactly ``--tokens`` tokens
(end-of-turn ignored), so the batch stays at ``--prompts`` x ``--group-size``
rows throughout and both sides do the same work: the workload of
bench_vs_trl.py (its first prompts, temperature 1, fp32, the embedded model).

Prints, per side, the best of ``--repeats`` runs: seconds, ms per generated
token (run time / rows / tokens) and ms per decode step (run time / tokens,
prefill included); the ratio; the fp32 GEMM peak measured in the same run
(bench_vs_trl.gemm_peak_flops, before and after); and a last-line JSON object.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_decode_cost.py [--threads 1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_trl import gemm_peak_flops, prompt_rows  # noqa: E402

from grpo.models import load_policy  # noqa: E402
from grpo.prompts import prompt_format  # noqa: E402
from grpo.rollout import generate  # noqa: E402
from grpo.streams import stream_keys  # noqa: E402


def own_seconds(model: object, tokenizer: object, prompts: list[list[int]], group: int, tokens: int) -> float:
    keys = stream_keys(0, 1, 0, torch.arange(len(prompts) * group))
    start = time.perf_counter()
    out = generate(model, tokenizer, prompts, group_size=group, max_new_tokens=tokens, temperature=1.0,
                   stop_token_ids=[], streams=keys)
    seconds = time.perf_counter() - start
    assert int(out.lengths.min()) == tokens, "every row runs the full length"
    return seconds


def transformers_seconds(model: object, tokenizer: object, prompts: list[list[int]], group: int, tokens: int) -> float:
    rows = [p for p in prompts for _ in range(group)]
    width = max(len(p) for p in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in rows])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens,
                             pad_token_id=tokenizer.pad_token_id)
    seconds = time.perf_counter() - start
    assert out.shape[1] - width == tokens
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: the CPUs this process may use)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    peak = gemm_peak_flops(threads)
    policy = load_policy("smollm2")
    model, tokenizer = policy.model.eval(), policy.tokenizer
    fmt = prompt_format(tokenizer, "chat")
    prompts = [fmt.encode(tokenizer, [{"role": "user", "content": r["prompt"]}]) for r in prompt_rows()]
    prompts = prompts[: args.prompts]
    best = {"own": float("inf"), "transformers": float("inf")}
    for _ in range(args.repeats):  # the two sides take turns, so that drifts of the machine hit both
        best["own"] = min(best["own"], own_seconds(model, tokenizer, prompts, args.group_size, args.tokens))
        best["transformers"] = min(best["transformers"], transformers_seconds(
            model, tokenizer, prompts, args.group_size, args.tokens))
    peak = max(peak, gemm_peak_flops(threads))
    rows = args.prompts * args.group_size
    print(f"batch {rows} rows x {args.tokens} tokens, {threads} threads, best of {args.repeats}")
    for side, seconds in best.items():
        print(f"{side:>13}: {seconds:7.2f} s  {1000 * seconds / (rows * args.tokens):7.2f} ms/token  "
              f"{1000 * seconds / args.tokens:7.1f} ms/step")
    print(f"own / transformers time: {best['own'] / best['transformers']:.3f}")
    print(f"fp32 GEMM peak: {peak / 1e9:.1f} GFLOP/s (2048^3 matmul, best of 8, before and after)")
    print(json.dumps({
        "rows": rows, "tokens": args.tokens, "threads": threads,
        "ms_per_token_own": round(1000 * best["own"] / (rows * args.tokens), 3),
        "ms_per_token_transformers": round(1000 * best["transformers"] / (rows * args.tokens), 3),
        "gemm_peak_gflops": round(peak / 1e9, 1),
    }))


if __name__ == "__main__":
    main()
