"""Rollout engines: the own sampler against vLLM (``--engine vllm``), on the embedded SmolLM2-135M in fp32.

Two workloads, each run by both engines in turn, ``--repeats`` times (the
best time counts):

- ``16x48``: 2 prompts x 8 completions of at most 48 tokens, stopping at the
  end of the turn: the fixed workload of bench/bench_vs_trl.py (its "What is
  a + b?" prompts), temperature 1.0;
- ``64x256``: 8 prompts x 8 completions of exactly 256 tokens (end-of-turn
  tokens do not stop them), a long-generation workload.

Tokens/s counts the completion tokens each engine sampled, over the seconds
its call took (for vLLM: the request to the worker process and back, the
building of the rollout included). Also measured: each engine's start-up
(own: loading the model; vLLM: writing the model for it and starting the
worker until it answers) and the weight sync per step (the full weights
pushed into vLLM in place, and a LoRA adapter of ``--lora-rank`` as a new
adapter version, with the extra time of the first generation that loads
it, each the mean of ``--syncs`` pushes). Prints a table and,
last, one JSON line.

    .venv/bin/python bench/bench_engines.py                        # both workloads, both engines
    .venv/bin/python bench/bench_engines.py --workloads 16x48 --repeats 1 --syncs 1 --lora-rank 0   # a quick check
    .venv/bin/python bench/bench_engines.py --engines own --device cuda   # the own engine's CUDA path
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

from grpo.models import add_lora, load_policy
from grpo.sampling.evaluate import encode_prompts
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.rollout import generate
from grpo.sampling.vllm_engine import VLLMEngine

TOPICS = ("the history of the bicycle", "how bread is made", "the water cycle", "a lighthouse keeper's day",
          "why the sky is blue", "the rules of chess", "a journey by train", "how bees make honey")


def prompts_for(workload: str, tokenizer: object) -> tuple[list[list[int]], int, int, bool]:
    """The workload's prompts, group size, token limit and whether an end-of-turn token stops a completion."""
    n, tokens = (int(x) for x in workload.split("x"))
    group = 8
    if workload == "16x48":
        pairs = [(23, 45), (67, 12)]
        messages = [[{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}] for a, b in pairs]
        return encode_prompts(tokenizer, messages), group, tokens, True
    messages = [[{"role": "user", "content": f"Write a long essay about {TOPICS[i % len(TOPICS)]}."}]
                for i in range(n // group)]
    return encode_prompts(tokenizer, messages), group, tokens, False


def timed(fn: object, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["16x48", "64x256"])
    parser.add_argument("--engines", nargs="+", default=["own", "vllm"], choices=["own", "vllm"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--syncs", type=int, default=3, help="weight pushes averaged for the sync time")
    parser.add_argument("--lora-rank", type=int, default=16, help="also time an adapter push at this rank (0: no)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="the own engine's device (vLLM runs where its build runs)")
    parser.add_argument("--vllm-memory", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result: dict[str, object] = {"threads": args.threads, "device": args.device}

    start = time.perf_counter()
    policy = load_policy("smollm2", device=torch.device(args.device))
    result["startup_seconds_own"] = round(time.perf_counter() - start, 2)
    model, tokenizer = policy.model.eval(), policy.tokenizer
    engine = None
    if "vllm" in args.engines:
        engine = VLLMEngine(model, tokenizer, memory=args.vllm_memory, max_model_len=1024)
        start = time.perf_counter()
        engine.start()
        result["startup_seconds_vllm"] = round(time.perf_counter() - start, 2)

    rows = []
    for workload in args.workloads:
        prompts, group, limit, stop = prompts_for(workload, tokenizer)
        streams = stream_keys(0, 1, 0, torch.arange(len(prompts) * group))
        sampling = dict(group_size=group, max_new_tokens=limit, temperature=1.0, streams=streams)
        for name in args.engines:
            sampler = engine.generate if name == "vllm" else functools.partial(generate, model, tokenizer)
            run = functools.partial(sampler, prompts, stop_token_ids=None if stop else [], **sampling)
            with torch.no_grad():
                seconds, rollout = timed(run, args.repeats)
            tokens = int(rollout.mask.sum())
            rows.append((workload, name, tokens, seconds))
            result[f"tokens_per_second_{name}_{workload}"] = round(tokens / seconds, 2)
            result[f"tokens_{name}_{workload}"] = tokens
            result[f"seconds_{name}_{workload}"] = round(seconds, 3)

    if engine is not None:
        pushes = [engine.push(model) for _ in range(args.syncs)]
        result["sync_seconds_full"] = round(sum(pushes) / len(pushes), 3)
        engine.close()
        if args.lora_rank:
            lora_model = add_lora(model, args.lora_rank)
            lora = VLLMEngine(lora_model, tokenizer, memory=args.vllm_memory, max_model_len=1024)
            lora.start()
            one = prompts_for("16x48", tokenizer)[0][:1]
            pushes = []
            for _ in range(args.syncs):  # the push, and what the first generation with the new version costs more
                t0 = time.perf_counter()
                lora.push(lora_model)
                lora.generate(one, group_size=1, max_new_tokens=1)  # vLLM loads the new adapter version here
                t1 = time.perf_counter()
                lora.generate(one, group_size=1, max_new_tokens=1)
                pushes.append(2 * t1 - t0 - time.perf_counter())
            result[f"sync_seconds_lora_r{args.lora_rank}"] = round(sum(pushes) / len(pushes), 3)
            lora.close()

    print(f"{'workload':<9} {'engine':<6} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for workload, name, tokens, seconds in rows:
        print(f"{workload:<9} {name:<6} {tokens:>7} {seconds:>8.2f} {tokens / seconds:>9.1f}")
    for key in sorted(k for k in result if k.startswith(("startup", "sync"))):
        print(f"{key}: {result[key]} s")
    print(json.dumps(result))


if __name__ == "__main__":  # vLLM's worker starts its own processes by spawn
    main()
