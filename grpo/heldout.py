"""The run's held-out evaluations: the full set before and after training, the alarms' fixed subset
during it, each under the progress bar and summed over processes.

Normalised advantages never show absolute progress, so a run always measures
greedy accuracy on prompts it does not train on (grpo/evaluate.py scores them).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from grpo.evaluate import EvalResult, evaluate
from grpo.parts import TrainerParts
from grpo.progress import StepProgress
from grpo.streams import stream_keys


def evaluate_heldout(trainer: TrainerParts, on_batch: Callable[[int], None] | None = None,
                     limit: int | None = None) -> EvalResult:
    """Greedy pass@1, and pass@k / maj@k from eval_samples samples, on the held-out prompts.

    Sample j of held-out prompt i draws from the stream of (seed, step 0,
    round 0, i * eval_samples + j), at every evaluation and whichever process
    scores it: successive evaluations differ only by the model, and pass@k is
    the same on any number of processes. Under torchrun each process scores
    every W-th prompt and the scores are summed.
    """
    cfg, world, device = trainer.config, trainer.world, trainer.device
    rank, size = world.rank, world.size
    n = len(trainer.heldout_prompts) if limit is None else limit
    prompts, rows = trainer.heldout_prompts[:n][rank::size], list(trainer.task.heldout)[:n][rank::size]
    k = max(cfg.eval_samples, 1)
    mine_rows = torch.arange(rank, n, size, device=device).repeat_interleave(k) * k
    streams = stream_keys(cfg.seed, 0, 0, mine_rows + torch.arange(k, device=device).repeat(len(prompts)))
    with trainer.autocast:
        mine = trainer.policy.without_grad(
            evaluate, trainer.tokenizer, prompts, rows, trainer.checker,
            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
            samples=cfg.eval_samples if limit is None else 0, ks=cfg.eval_k, temperature=cfg.temperature,
            streams=streams, on_batch=on_batch, stop_strings=cfg.stop, agent=trainer.agent,
        )
    if size == 1:
        return mine
    keys_p, keys_m = sorted(mine.pass_at), sorted(mine.maj_at)
    values = [mine.accuracy, *(mine.pass_at[k] for k in keys_p), *(mine.maj_at[k] for k in keys_m)]
    totals = world.sum(torch.tensor([len(prompts), *(v * len(prompts) for v in values)], dtype=torch.float64))
    n = max(float(totals[0]), 1.0)
    means = [float(t) / n for t in totals[1:]]
    return EvalResult(
        accuracy=means[0], size=int(totals[0]), samples=mine.samples,
        pass_at=dict(zip(keys_p, means[1 : 1 + len(keys_p)], strict=True)),
        maj_at=dict(zip(keys_m, means[1 + len(keys_p) :], strict=True)), solved=mine.solved,
    )


def subset_size(trainer: TrainerParts) -> int:
    """The alarms' fixed subset: the first eval_subset held-out prompts (all when 0 or more than there are)."""
    return min(trainer.config.eval_subset or len(trainer.heldout_prompts), len(trainer.heldout_prompts))


def subset_accuracy(trainer: TrainerParts, full: EvalResult) -> dict[str, float]:
    """The accuracy on the alarms' fixed subset, read from a full evaluation's greedy results: the same
    deterministic completions, so no second pass."""
    n, rank, size = subset_size(trainer), trainer.world.rank, trainer.world.size
    mine = [ok for i, ok in zip(range(rank, len(trainer.heldout_prompts), size), full.solved, strict=False) if i < n]
    solved = trainer.world.sum(torch.tensor([float(sum(mine))], dtype=torch.float64)) if size > 1 else sum(mine)
    return {"heldout_subset_accuracy": float(solved) / max(n, 1)}


def interim_evaluation(trainer: TrainerParts, bar: StepProgress) -> dict[str, float]:
    """The evaluation during training: the alarms' subset, or everything when the subset is all of it."""
    whole = subset_size(trainer) >= len(trainer.heldout_prompts)
    result, seconds = evaluate_with(trainer, bar, subset=not whole)
    scores = result.metrics() if whole else {}
    return {**scores, "heldout_subset_accuracy": result.accuracy, "time_eval": seconds}


def evaluate_with(trainer: TrainerParts, bar: StepProgress, *, subset: bool = False) -> tuple[EvalResult, float]:
    """Evaluate under an evaluation progress bar; return the result and the seconds it took.

    ``subset``: greedy pass@1 on the first eval_subset held-out prompts only (the alarms' series).
    """
    size = subset_size(trainer) if subset else len(trainer.heldout_prompts)
    passes = 1 + (trainer.config.eval_samples > 0 and not subset)
    start = time.perf_counter()
    with bar.evaluating(passes * size) as advance:
        result = trainer.evaluate(on_batch=advance, limit=size if subset else None)
    return result, time.perf_counter() - start
