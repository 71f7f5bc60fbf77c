"""One GRPO step per case, run by torchrun (N processes) or in-process (a world of one).

Sampling is made independent of the world size for the comparison: each
prompt's group is drawn with a generator seeded by the prompt itself, so a
group's completions are the same whichever process samples it. Everything
after sampling (rewards, advantages, normalisers, gradients) is the code
under test.

Usage: python -m torch.distributed.run --nproc-per-node 2 tests/distributed_worker.py OUT CASES_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from conftest import make_model, make_tokenizer  # noqa: E402

import grpo.trainer  # noqa: E402
from grpo.config import TrainConfig  # noqa: E402
from grpo.distributed import full_state_dict  # noqa: E402
from grpo.rollout import Rollout, generate  # noqa: E402
from grpo.tasks import Task  # noqa: E402


def first_char(completion, example):
    """Graded and varied on a random model: most groups are mixed."""
    return (ord(completion[0]) % 5) / 4 if completion else 0.0


def rare_first_char(completion, example):
    """Right one time in five: many groups are all wrong, so skipping them is exercised."""
    return float(bool(completion) and ord(completion[0]) % 5 == 0)


REWARDS = {"first_char": first_char, "rare_first_char": rare_first_char}


def generate_per_prompt(model, tokenizer, prompts, *, group_size, generator=None, **kw) -> Rollout:
    """generate() one prompt at a time, each with a generator seeded by its token ids."""
    parts = [
        generate(model, tokenizer, [p], group_size=group_size,
                 generator=torch.Generator().manual_seed(sum(i * t for i, t in enumerate(p, 1))), **kw)
        for p in prompts
    ]
    width = max(r.mask.shape[1] for r in parts)

    def cat(name: str, value: float) -> torch.Tensor:
        return torch.cat([F.pad(getattr(r, name), (0, width - r.mask.shape[1]), value=value) for r in parts])

    return Rollout(
        prompt_ids=[r.prompt_ids[0] for r in parts],
        completion_ids=cat("completion_ids", tokenizer.pad_token_id),
        mask=cat("mask", 0.0),
        logprobs=cat("logprobs", 0.0),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts],
        group_size=group_size,
    )


def run_case(case: dict) -> dict:
    """Build the tiny model, take one step; return the full parameters and the step's metrics."""
    case = dict(case)
    reward = REWARDS[case.pop("reward", "first_char")]
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    config = TrainConfig(**{
        "temperature": 1.0, "sampler": "uniform", "filter_groups": False,
        "preflight": "off", "steps": 1, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, "lr": 1e-3,
        "warmup_steps": 0, "eval_size": 8, "sample_every": 0, "device": "cpu", "save_model": False,
        "seed": 5, **case,
    })
    trainer = grpo.trainer.GRPOTrainer(
        config, model=model, tokenizer=tokenizer, task=Task("tiny", rows[:32], rows[32:], reward), progress=False,
    )
    original = grpo.trainer.generate
    grpo.trainer.generate = generate_per_prompt
    try:
        metrics = trainer.step(1)
    finally:
        grpo.trainer.generate = original
    state = full_state_dict(model, trainer.world) or model.state_dict()
    return {"params": {k: v.detach().clone() for k, v in state.items()}, "metrics": metrics,
            "world_size": trainer.world.size}


def main() -> None:
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    results = [run_case(case) for case in cases]
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(results, out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
