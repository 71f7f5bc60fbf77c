"""Multi-turn rollouts: the KV cache continued across turns against encoding the conversation again each turn.

The workload is ``calc`` episodes of the embedded SmolLM2-135M on bare products
(``calc`` without its added term, which the starting model answers through the
calculator, so its episodes have several turns: the call, the calculator's
result, the answer; up to 3 turns of at most 32 tokens), greedy,
so that both ways sample the same episodes; each way runs the same prompts,
taking turns, ``--repeats`` times, and the best time counts. "continued" is the
trainer's way (grpo/sampling/episodes.py: the environment's tokens are run onto each
episode's cache); "re-encoded" encodes prompt and transcript from the start
before every turn (``Agent.reencode``). Prints a table and, last, one JSON line.

    .venv/bin/python bench/bench_rollout.py                   # 16 prompts x 4 episodes
    .venv/bin/python bench/bench_rollout.py --prompts 2 --group-size 2 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpo.models import load_policy
from grpo.sampling.environments import ToolEnv, template_features
from grpo.sampling.episodes import Agent
from grpo.sampling.tools import ToolBox
from grpo.tasks import get_task
from grpo.tasks.calc import EXAMPLE


def run(agent: Agent, policy: object, rows: list, group_size: int) -> tuple[float, object]:
    start = time.perf_counter()
    rollout = agent.run(policy.model, policy.tokenizer, rows, group_size=group_size, max_new_tokens=32,
                        temperature=0.0)
    return time.perf_counter() - start, rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy("smollm2", device=torch.device("cpu"))
    policy.model.eval()
    task = get_task("calc")
    rows = [{"prompt": [*EXAMPLE, {"role": "user", "content": f"What is {a} * {b}?"}], "answer": str(a * b)}
            for a, b in ((4721 + 37 * i, 38 + 11 * i) for i in range(args.prompts))]
    box = ToolBox(task.tools, workers=0)  # in-process: the comparison is of the model's work
    native, role = template_features(policy.tokenizer, box.schemas)

    def make_env() -> ToolEnv:
        return ToolEnv(box, task.messages, role, native)

    ways = {"continued": Agent(make_env, max_turns=3, max_episode_tokens=288),
            "re-encoded": Agent(make_env, max_turns=3, max_episode_tokens=288, reencode=True)}
    best: dict[str, float] = {}
    rollouts = {}
    for _ in range(args.repeats):
        for name, agent in ways.items():
            seconds, rollouts[name] = run(agent, policy, rows, args.group_size)
            best[name] = min(best.get(name, float("inf")), seconds)
    a, b = rollouts["continued"], rollouts["re-encoded"]
    same = [x["content"] for e in a.episodes for x in e.transcript()] == [
        x["content"] for e in b.episodes for x in e.transcript()]
    sampled = int(a.mask.sum())
    turns = sum(e.turns for e in a.episodes) / len(a.episodes)
    print(f"calc episodes: {len(a.episodes)} ({args.prompts} prompts x {args.group_size}), {turns:.2f} turns each, "
          f"{sampled} policy tokens, {int(a.env_mask.sum())} environment tokens; same transcripts both ways: {same}")
    print(f"{'way':<12} {'seconds':>8} {'policy tokens/s':>16}")
    for name in ways:
        print(f"{name:<12} {best[name]:>8.2f} {sampled / best[name]:>16.1f}")
    print(json.dumps({
        "episodes": len(a.episodes), "turns_per_episode": round(turns, 3), "policy_tokens": sampled,
        "same_transcripts": same, "threads": args.threads,
        "seconds_continued": round(best["continued"], 3), "seconds_reencoded": round(best["re-encoded"], 3),
        "tokens_per_second_continued": round(sampled / best["continued"], 2),
        "tokens_per_second_reencoded": round(sampled / best["re-encoded"], 2),
        "speedup": round(best["re-encoded"] / best["continued"], 3),
    }))


if __name__ == "__main__":
    main()
