"""One of 4 torchrun processes (gloo) for tests/test_empty_rank.py: a round of 3 prompts, so rank 3 has none,
under FSDP with the own sampler (every rank gathers every unit) and with a stand-in vLLM engine (the
others sample outside the policy: rank 3 must not gather alone). Writes each rank's findings as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from conftest import make_model, make_tokenizer  # noqa: E402

import grpo.run.build  # noqa: E402
import grpo.run.process_setup  # noqa: E402
import grpo.run.trainer  # noqa: E402
from grpo.sampling.rollout import Rollout  # noqa: E402
from grpo.sampling.rounds import generate_round  # noqa: E402
from grpo.tasks import Task  # noqa: E402


class StandInEngine:
    """vLLM's place: completions of one token each, made without the policy (no collective)."""

    def generate(self, prompts, *, group_size, streams=None, **_):
        n = len(prompts) * group_size
        return Rollout(prompt_ids=[p for p in prompts for _ in range(group_size)],
                       completion_ids=torch.full((n, 1), 5), mask=torch.ones((n, 1)), logprobs=torch.zeros((n, 1)),
                       truncated=torch.zeros(n, dtype=torch.bool), texts=["a"] * n, group_size=group_size)

    def close(self):
        pass


def main() -> None:
    out = Path(sys.argv[1])
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    config = grpo.config.TrainConfig(preflight="off", steps=1, prompts_per_step=4, group_size=2, max_new_tokens=4,
                                     eval_size=8, device="cpu", save_model=False, fsdp=True, reward_workers=0)
    grpo.run.process_setup.setup_process(config)
    run = grpo.run.build.resolve_run(config, task=Task("tiny", rows[:32], rows[32:], lambda c, e: float("a" in c)),
                                 model=model)
    trainer = grpo.run.trainer.GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    found = {}
    for name, engine in (("own", None), ("vllm", StandInEngine())):
        trainer.sampling.generation.engine = engine
        done = generate_round(trainer.sampling, [0, 1, 2], step=1, index=1)
        found[name] = {"mine": len(done.mine), "rows": int(done.lengths.numel()),
                       "devices": sorted({str(t.device) for t in (done.rewards, done.lengths, done.truncated,
                                                                  done.errors, done.rollout.completion_ids)})}
    trainer.sampling.generation.engine = None
    trainer.close()
    rank = trainer.world.rank
    torch.distributed.barrier()  # every rank done before any tears the group down (gloo aborts a peer mid-teardown)
    # written before the teardown: what the test checks is the round, which a rank left in an unmatched
    # collective never finishes (the test's timeout ends it)
    (out / f"rank{rank}.json").write_text(json.dumps({"device": str(trainer.device), **found}))
    trainer.world.close()


if __name__ == "__main__":
    main()
