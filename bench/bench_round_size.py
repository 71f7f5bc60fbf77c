"""One generation round of R prompts against R / B rounds of B: what ``--round-prompts`` saves in decoding.

    python bench/bench_round_size.py --model RUN/model --data FILE [--prompts 32] [--per-round 8]
        [--group-size 8] [--max-new-tokens 96] [--temperature 0.7] [--repeats 2] [--threads 2]

The same ``--prompts`` prompts of the file (its first rows, its ``question`` or ``prompt`` field in the
model's chat template), sampled by the own engine (grpo/sampling/rollout.py ``generate``, inside the reordered
weights and heap scope a training step samples in) once in one round and once in rounds of
``--per-round`` prompts, each row ending at end-of-turn or the token limit, the two alternating
``--repeats`` times with other prompts each time. Prints wall seconds, tokens and each round's longest
completion per side, the ratio, and a last-line JSON object. The two sides draw from the same random
streams' keys but not the same rows' keys, so their completions differ: compare the seconds with the
tokens beside them.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpo.models import load_policy
from grpo.sampling.packed_linear import packed_linears
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.rollout import generate
from grpo.system.heap_settings import reuse_freed_memory


def prompt_ids(tokenizer: object, path: str, n: int) -> list[list[int]]:
    rows = [json.loads(line) for line in open(path)][:n]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": r.get("question") or r["prompt"]}],
                                           add_generation_prompt=True, tokenize=False) for r in rows]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def rounds(policy: object, chunks: list[list[list[int]]], args: argparse.Namespace, seed: int) -> dict:
    start, tokens, longest = time.perf_counter(), 0, []
    for k, chunk in enumerate(chunks):
        keys = stream_keys(seed, 1, k, torch.arange(len(chunk) * args.group_size))
        with torch.no_grad():
            out = generate(policy.model, policy.tokenizer, chunk, group_size=args.group_size,
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature, streams=keys)
        tokens += int(out.lengths.sum())
        longest.append(int(out.lengths.max()))
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "longest": longest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--per-round", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy(args.model, device=torch.device("cpu"))
    policy.model.eval()
    ids = prompt_ids(policy.tokenizer, args.data, args.prompts * (args.repeats + 1))
    one_total = split_total = 0.0
    with packed_linears(policy.model, lazy=True), reuse_freed_memory():
        rounds(policy, [ids[: args.per_round]], args, 99)  # warm-up
        for rep in range(args.repeats):
            batch = ids[(rep + 1) * args.prompts:(rep + 2) * args.prompts]
            one = rounds(policy, [batch], args, rep)
            split = rounds(policy, [batch[i:i + args.per_round] for i in range(0, len(batch), args.per_round)],
                           args, rep)
            one_total, split_total = one_total + one["seconds"], split_total + split["seconds"]
            print(f"repeat {rep}: one round of {len(batch) * args.group_size} rows {one['seconds']:.1f} s, "
                  f"{one['tokens']} tokens, longest {one['longest']}; rounds of {args.per_round * args.group_size} "
                  f"rows {split['seconds']:.1f} s, {split['tokens']} tokens, longest {split['longest']}", flush=True)
    print(f"one round / rounds: {one_total / split_total:.3f} of the seconds")
    print(json.dumps({"one_round_s": round(one_total, 2), "rounds_s": round(split_total, 2),
                      "ratio": round(one_total / split_total, 3), "threads": args.threads}))


if __name__ == "__main__":
    main()
