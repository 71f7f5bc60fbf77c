"""What one generated token costs: the own engine against transformers' ``generate`` at a fixed batch.

bench_vs_trl.py's rollout tokens/s divides each side's sampled tokens by its
generation time; both sides decode until the longest completion of the step
ends, so that figure moves with the lengths each side happened to sample. Here
every row runs exactly ``--tokens`` tokens (end-of-turn ignored), so the batch
stays at ``rows`` throughout and both sides do the same work: bench_vs_trl.py's
prompts (2 prompts x G for 16 rows, 8 x G for 64), temperature 1, fp32, the
embedded model.

Timed with ``time.process_time`` (this process's CPU seconds: a shared machine's
other jobs add little), on ``--threads`` threads (1 by default), the two sides
alternating ``--repeats`` times after one warm-up pair; the process's heap is set
as a training process sets it (``heap_release_mb`` = 1), and transformers'
``generate`` runs inside the same heap scope as the own engine's turns
(grpo/system/heap_settings.py), as a TRL process's glibc keeps its freed blocks too. Prints, per
batch and side, ms per generated token per row (CPU seconds / rows / tokens)
and ms per decode step; the ratio; where the own engine's time goes (its
functions timed by wrappers: the decoder's forward, the fp32 output layer,
sampling, the random streams, the prompt's prefill, the rest of the loop); the
fp32 GEMM peak (a 2048^3 matmul, best of 8, CPU seconds); a last-line JSON object.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_decode_cost.py [--rows 16 64] [--tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_trl import prompt_rows  # noqa: E402

import grpo.sampling.decode_loop as decode_loop  # noqa: E402
import grpo.sampling.rollout as rollout  # noqa: E402
from grpo.models import load_policy  # noqa: E402
from grpo.sampling.prompts import prompt_format  # noqa: E402
from grpo.sampling.random_streams import stream_keys  # noqa: E402
from grpo.system.heap_settings import release_freed_memory, reuse_freed_memory  # noqa: E402

PARTS = {  # the own engine's functions timed, and what each is
    "decode": "decoder forward (decode steps)",
    "head_logits": "output layer (fp32)",
    "sample_next": "sampling (softmax, inverse CDF)",
    "stream_uniforms": "random streams",
    "start_state": "prompt prefill",
}
# the module each part is looked up in when it is called, so the one where its wrapper must sit: the decode loop
# (grpo/sampling/decode_loop.py) calls the first four, generate (grpo/sampling/rollout.py) the prefill
CALLED_FROM = {"decode": decode_loop, "head_logits": decode_loop, "sample_next": decode_loop,
               "stream_uniforms": decode_loop, "start_state": rollout}
GROUP = 8


def gemm_peak_cpu(n: int = 2048, repeats: int = 8) -> float:
    """Best fp32 matmul rate (FLOP/s) of an n x n x n product, in CPU seconds of this process."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        torch.matmul(a, b)
        best = min(best, time.process_time() - start)
    return 2 * n**3 / best


def timed_parts() -> collections.Counter:
    """Wrap the own engine's parts (PARTS) so that each call adds its own CPU seconds to the returned counter
    (a part called inside another, as the output layer inside the prefill, counts for itself alone)."""
    spent: collections.Counter = collections.Counter()
    inside: list[float] = []  # the CPU seconds of nested parts, one entry per part running

    def wrap(name: str) -> None:
        inner = getattr(CALLED_FROM[name], name)

        def timed(*args: object, **kwargs: object) -> object:
            start = time.process_time()
            inside.append(0.0)
            try:
                return inner(*args, **kwargs)
            finally:
                seconds = time.process_time() - start
                spent[name] += seconds - inside.pop()
                if inside:
                    inside[-1] += seconds
        setattr(CALLED_FROM[name], name, timed)

    for name in PARTS:
        wrap(name)
    return spent


def own_seconds(model: object, tokenizer: object, prompts: list[list[int]], tokens: int) -> float:
    keys = stream_keys(0, 1, 0, torch.arange(len(prompts) * GROUP))
    start = time.process_time()
    out = rollout.generate(model, tokenizer, prompts, group_size=GROUP, max_new_tokens=tokens, temperature=1.0,
                           stop_token_ids=[], streams=keys)
    seconds = time.process_time() - start
    assert int(out.lengths.min()) == tokens, "every row runs the full length"
    return seconds


def transformers_seconds(model: object, tokenizer: object, prompts: list[list[int]], tokens: int) -> float:
    rows = [p for p in prompts for _ in range(GROUP)]
    width = max(len(p) for p in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in rows])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    start = time.process_time()
    with torch.no_grad(), reuse_freed_memory():
        out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens,
                             pad_token_id=tokenizer.pad_token_id)
    seconds = time.process_time() - start
    assert out.shape[1] - width == tokens
    return seconds


def measure(model: object, tokenizer: object, prompts: list[list[int]], tokens: int, repeats: int,
            spent: collections.Counter) -> dict:
    """Both sides on these prompts, alternating; CPU seconds summed over the repeats after a warm-up pair."""
    total = {"own": 0.0, "transformers": 0.0}
    for i in range(repeats + 1):
        if i == 1:
            spent.clear()
        own = own_seconds(model, tokenizer, prompts, tokens)
        other = transformers_seconds(model, tokenizer, prompts, tokens)
        if i:
            total["own"] += own
            total["transformers"] += other
    parts = {name: spent[name] / total["own"] for name in PARTS}
    parts["rest"] = 1.0 - sum(parts.values())
    return {"total": total, "parts": parts}


def report(rows: int, tokens: int, repeats: int, result: dict) -> dict:
    """Print one batch's figures; return them for the JSON line."""
    total, per_token = result["total"], {}
    print(f"batch {rows} rows x {tokens} tokens, CPU seconds over {repeats} runs a side")
    for side, seconds in total.items():
        per_token[side] = 1000 * seconds / (repeats * rows * tokens)
        print(f"{side:>13}: {seconds:7.2f} s  {per_token[side]:6.2f} ms/token/row  "
              f"{1000 * seconds / (repeats * tokens):7.1f} ms/step")
    print(f"own / transformers time: {total['own'] / total['transformers']:.3f}")
    for name, share in result["parts"].items():
        print(f"   {PARTS.get(name, 'the rest of the loop (bookkeeping, stop checks)'):<48} {100 * share:5.1f}%")
    return {f"ms_per_token_own_{rows}": round(per_token["own"], 3),
            f"ms_per_token_transformers_{rows}": round(per_token["transformers"], 3),
            **{f"share_{name}_{rows}": round(share, 4) for name, share in result["parts"].items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--rows", type=int, nargs="+", default=[16, 64], help="batches (multiples of 8: prompts x 8)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    release_freed_memory(1)
    peak = gemm_peak_cpu()
    policy = load_policy("smollm2")
    model, tokenizer = policy.model.eval(), policy.tokenizer
    fmt = prompt_format(tokenizer, "chat")
    prompts = [fmt.encode(tokenizer, [{"role": "user", "content": r["prompt"]}]) for r in prompt_rows()]
    spent, figures = timed_parts(), {"threads": args.threads, "tokens": args.tokens}
    for rows in args.rows:
        result = measure(model, tokenizer, prompts[: rows // GROUP], args.tokens, args.repeats, spent)
        figures |= report(rows, args.tokens, args.repeats, result)
    peak = max(peak, gemm_peak_cpu())
    print(f"fp32 GEMM peak: {peak / 1e9:.1f} GFLOP/s on {args.threads} thread(s) (2048^3 matmul, best of 8, "
          "CPU seconds, before and after)")
    print(json.dumps(figures | {"gemm_peak_gflops": round(peak / 1e9, 1)}))


if __name__ == "__main__":
    main()
