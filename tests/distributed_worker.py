"""One GRPO step per case, run by torchrun (N processes) or in-process (a world of one).

Nothing is replaced: sampling draws each completion's random numbers from
its own stream (grpo/sampling/random_streams.py), so the same global batch is sampled
whatever the number of processes, and everything after it (rewards, group
filtering, advantages, normalisers, gradients) is the code under test.

Usage: python -m torch.distributed.run --nproc-per-node 2 tests/distributed_worker.py OUT CASES_JSON
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from conftest import make_model, make_tokenizer  # noqa: E402

import grpo.run.build  # noqa: E402
import grpo.run.process_setup  # noqa: E402
import grpo.run.trainer  # noqa: E402
from grpo.config import TrainConfig  # noqa: E402
from grpo.observe.heldout import evaluate_heldout  # noqa: E402
from grpo.sampling.rollout import Rollout  # noqa: E402
from grpo.system.distributed import full_state_dict  # noqa: E402
from grpo.tasks import Task  # noqa: E402


def first_char(completion, example):
    """Graded and varied on a random model: most groups are mixed."""
    return (ord(completion[0]) % 5) / 4 if completion else 0.0


def rare_first_char(completion, example):
    """Right one time in five: many groups are all wrong, so skipping them is exercised."""
    return float(bool(completion) and ord(completion[0]) % 5 == 0)


def raises_on_odd(completion, example):
    """first_char, but a checker bug on completions that start with an odd character: errored rows."""
    if completion and ord(completion[0]) % 2:
        raise ValueError("checker cannot parse this")
    return first_char(completion, example)


REWARDS = {"first_char": first_char, "rare_first_char": rare_first_char, "raises_on_odd": raises_on_odd}


def run_case(case: dict) -> dict:
    """Build the tiny model, take one step; return the full parameters, the step's metrics, every
    completion generated (the whole draws', in order), the trained groups' prompts and, with
    ``same_prompt`` (every row asks the same), each process's own completions."""
    case = dict(case)
    reward = REWARDS[case.pop("reward", "first_char")]
    same_prompt = case.pop("same_prompt", False)
    shape = {key: case.pop(key) for key in ("layers", "hidden") if key in case}
    env = None
    if case.pop("episodes", False):  # multi-turn: any "a" ends a turn, the environment replies until turn 3
        from test_agent_training import Talk

        env = Talk
        case = {"stop": ["a"], "max_new_tokens": 64, "max_turns": 3, **case}
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, **shape)
    rows = [{"prompt": "say a" if same_prompt else f"say a {i}", "answer": "a"} for i in range(40)]
    config = TrainConfig(**{
        "temperature": 1.0, "sampler": "uniform", "filter_groups": False,
        "preflight": "off", "steps": 1, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, "lr": 1e-3,
        "warmup_steps": 0, "eval_size": 8, "sample_every": 0, "device": "cpu", "save_model": False,
        "seed": 5, **case,
    })
    grpo.run.process_setup.setup_process(config)
    run = grpo.run.build.resolve_run(config, task=Task("tiny", rows[:32], rows[32:], reward), model=model)
    trainer = grpo.run.trainer.GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False, env=env)
    held = watch_gathered_layers(trainer) if trainer.world.fsdp else []
    batches = []
    take = trainer.batches.next
    trainer.batches.next = lambda step: batches.append(take(step)[0]) or (batches[-1], {})
    metrics = trainer.step(1)
    if config.eval_samples:  # sampled pass@k after the step, as its processes share out the prompts
        metrics.update(evaluate_heldout(trainer.sampling).metrics())
    state = full_state_dict(model, trainer.world) or model.state_dict()
    world, batch = trainer.world, batches[0]
    own = [completions(r.rollout) for r in batch.rounds]
    return {
        "params": {k: v.detach().clone() for k, v in state.items()}, "metrics": metrics,
        "world_size": world.size,
        "generated": [sum(parts, []) for parts in zip(*world.gather_objects(own), strict=True)],
        "trained_prompts": sum(world.gather_objects([str(row["prompt"]) for row in batch.rows]), []),
        "own_completions": world.gather_objects(sum(own, [])),
        "state_bytes": world.gather_objects(state_bytes(trainer)),
        "fsdp_units": [fsdp_units(trainer.policy), fsdp_units(trainer.reference)],
        "layers_held": world.gather_objects(max(held, default=0)),
        "peak_rss_mib": world.gather_objects(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def watch_gathered_layers(trainer: grpo.run.trainer.GRPOTrainer) -> list[int]:
    """At each decoder layer's forward in a training pass (with grad), how many of the policy's layers are
    gathered in full: FSDP2 swaps a unit's sharded parameters (DTensors) for whole ones while gathered."""
    from torch.distributed.tensor import DTensor

    from grpo.system.distributed import decoder_layers

    layers, held = decoder_layers(trainer.model), []

    def count(module: torch.nn.Module, args: object) -> None:
        if torch.is_grad_enabled():
            held.append(sum(not isinstance(next(layer.parameters()), DTensor) for layer in layers))

    for layer in layers:
        layer.register_forward_pre_hook(count)
    return held


def fsdp_units(module: torch.nn.Module | None) -> int:
    from torch.distributed.fsdp import FSDPModule

    return 0 if module is None else sum(isinstance(m, FSDPModule) for m in module.modules())


def state_bytes(trainer: grpo.run.trainer.GRPOTrainer) -> int:
    """Bytes this process holds of parameters, gradients and optimiser state (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor

    params = list(trainer.model.parameters())
    tensors = params + [p.grad for p in params if p.grad is not None]
    tensors += [v for state in trainer.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def completions(rollout: Rollout) -> list[list[int]]:
    """Each row's sampled token ids."""
    return [row[:n].tolist() for row, n in zip(rollout.completion_ids, rollout.lengths, strict=True)]


def run_stop_case(rank_that_stops: int) -> dict:
    """A 3-step run whose alarms say "stop" on one rank only (as when each rank's own timing moves its
    alarm window): the ranks must agree, on rank 0's verdict, or one leaves the loop while the others
    wait in a collective. Returns the steps each rank ran."""
    from grpo.observe.alarm_monitor import AlarmMonitor

    if int(os.environ["RANK"]) == rank_that_stops:
        AlarmMonitor.stopping = lambda self: f"no_signal (forced on rank {rank_that_stops})"
    tokenizer = make_tokenizer()
    config = TrainConfig(temperature=1.0, sampler="uniform", filter_groups=False, preflight="off", steps=3,
                         prompts_per_step=4, group_size=4, max_new_tokens=4, eval_size=4, sample_every=0,
                         device="cpu", save_model=False, seed=5, early_stop=True, eval_every=-1)
    grpo.run.process_setup.setup_process(config)
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    model = make_model(len(tokenizer), seed=3)
    run = grpo.run.build.resolve_run(config, task=Task("tiny", rows[:32], rows[32:], first_char), model=model)
    trainer = grpo.run.trainer.GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    summary = trainer.train(None)
    return {"steps": trainer.world.gather_objects(summary["steps"]),
            "stopped": trainer.world.gather_objects(summary["stopped_early"])}


def main() -> None:
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    if isinstance(cases, dict):  # one run of another kind
        results = run_stop_case(cases["stop_on_rank"])
    else:
        results = [run_case(case) for case in cases]
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(results, out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
