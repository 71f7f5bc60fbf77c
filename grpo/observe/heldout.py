"""The run's evaluations: the full held-out set before and after training, the alarms' fixed subset
during it, and beside each a fixed sample of training prompts; each under the progress bar and summed
over processes.

Normalised advantages never show absolute progress, so a run always measures
greedy accuracy on prompts it does not train on (grpo/sampling/evaluate.py scores them).
Greedy accuracy on training prompts beside it measures memorising: a gap that
grows while held-out accuracy stays flat. The training sample is carved out of
the subset's budget (``eval_train`` of ``eval_subset``), so the evaluations cost
what they did.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from grpo.observe.progress import StepProgress
from grpo.sampling.evaluate import EvalResult, evaluate
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.step_parts import Sampling


def evaluate_heldout(sampling: Sampling, on_batch: Callable[[int], None] | None = None,
                     limit: int | None = None) -> EvalResult:
    """Greedy pass@1, and pass@k / maj@k from eval_samples samples, on the held-out prompts.

    Sample j of held-out prompt i draws from the stream of (seed, step 0,
    round 0, i * eval_samples + j), at every evaluation and whichever process
    scores it: successive evaluations differ only by the model, and pass@k is
    the same on any number of processes. Under torchrun each process scores
    every W-th prompt and the scores are summed.
    """
    cfg, gen = sampling.config, sampling.generation
    world, device = gen.world, gen.device
    rank, size = world.rank, world.size
    n = len(sampling.heldout_prompts) if limit is None else limit
    prompts, rows = sampling.heldout_prompts[:n][rank::size], list(sampling.task.heldout)[:n][rank::size]
    k = max(cfg.eval_samples, 1)
    mine_rows = torch.arange(rank, n, size, device=device).repeat_interleave(k) * k
    streams = stream_keys(cfg.seed, 0, 0, mine_rows + torch.arange(k, device=device).repeat(len(prompts)))
    with gen.autocast, gen.policy.gathered() as model:
        mine = evaluate(
            model, gen.tokenizer, prompts, rows, sampling.scoring.checker,
            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
            samples=cfg.eval_samples if limit is None else 0, ks=cfg.eval_k, temperature=gen.temperature.value,
            streams=streams, on_batch=on_batch, stop_strings=cfg.stop, agent=gen.agent,
            token_budget=cfg.micro_batch_tokens,
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


def subset_size(sampling: Sampling) -> int:
    """The alarms' fixed subset: the first eval_subset - eval_train held-out prompts (all when eval_subset
    is 0 or more than there are)."""
    cfg, n = sampling.config, len(sampling.heldout_prompts)
    return min(max(cfg.eval_subset - train_sample_size(sampling), 1) if cfg.eval_subset else n, n)


def train_sample_size(sampling: Sampling) -> int:
    """Training prompts in the fixed sample scored beside the held-out subset."""
    return min(sampling.config.eval_train, len(sampling.train_prompts))


def train_sample(sampling: Sampling) -> list[int]:
    """The fixed sample: indices into the training rows, the same at every evaluation (drawn from the seed)."""
    return sorted(random.Random(sampling.config.seed).sample(range(len(sampling.train_prompts)),
                                                            train_sample_size(sampling)))


def train_sample_accuracy(sampling: Sampling, bar: StepProgress) -> dict[str, float]:
    """Greedy accuracy on the fixed training sample (none when it is empty)."""
    chosen = train_sample(sampling)
    if not chosen:
        return {}
    rows = list(sampling.task.train)
    with bar.evaluating(len(chosen)) as advance:
        result = evaluate_prompts(sampling, [sampling.train_prompts[i] for i in chosen], [rows[i] for i in chosen],
                                  advance)
    return {"train_sample_accuracy": result.accuracy}


def evaluate_prompts(sampling: Sampling, prompts: list[list[int]], rows: list, on_batch: Callable[[int], None]
                     ) -> EvalResult:
    """Greedy pass@1 on the given prompts, each process scoring every W-th one, summed."""
    cfg, gen = sampling.config, sampling.generation
    world = gen.world
    with gen.autocast, gen.policy.gathered() as model:
        mine = evaluate(
            model, gen.tokenizer, prompts[world.rank::world.size], rows[world.rank::world.size],
            sampling.scoring.checker, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
            on_batch=on_batch, stop_strings=cfg.stop, agent=gen.agent, token_budget=cfg.micro_batch_tokens)
    if world.size == 1:
        return mine
    totals = world.sum(torch.tensor([float(mine.size), mine.accuracy * mine.size], dtype=torch.float64))
    return EvalResult(accuracy=float(totals[1]) / max(float(totals[0]), 1.0), size=int(totals[0]))


def subset_accuracy(sampling: Sampling, full: EvalResult) -> dict[str, float]:
    """The accuracy on the alarms' fixed subset, read from a full evaluation's greedy results: the same
    deterministic completions, so no second pass."""
    world, n = sampling.generation.world, subset_size(sampling)
    rank, size = world.rank, world.size
    mine = [ok for i, ok in zip(range(rank, len(sampling.heldout_prompts), size), full.solved, strict=False) if i < n]
    solved = world.sum(torch.tensor([float(sum(mine))], dtype=torch.float64)) if size > 1 else sum(mine)
    return {"heldout_subset_accuracy": float(solved) / max(n, 1)}


def interim_evaluation(sampling: Sampling, bar: StepProgress) -> dict[str, float]:
    """The evaluation during training: the alarms' subset (or everything when the subset is all of it)
    and the training sample."""
    whole = subset_size(sampling) >= len(sampling.heldout_prompts)
    start = time.perf_counter()
    result, _ = evaluate_with(sampling, bar, subset=not whole)
    scores = result.metrics() if whole else {}
    train = train_sample_accuracy(sampling, bar)
    return {**scores, "heldout_subset_accuracy": result.accuracy, **train, "time_eval": time.perf_counter() - start}


def evaluate_with(sampling: Sampling, bar: StepProgress, *, subset: bool = False) -> tuple[EvalResult, float]:
    """Evaluate under an evaluation progress bar; return the result and the seconds it took.

    ``subset``: greedy pass@1 on the first eval_subset held-out prompts only (the alarms' series).
    """
    size = subset_size(sampling) if subset else len(sampling.heldout_prompts)
    passes = 1 + (sampling.config.eval_samples > 0 and not subset)
    start = time.perf_counter()
    with bar.evaluating(passes * size) as advance:
        result = evaluate_heldout(sampling, on_batch=advance, limit=size if subset else None)
    return result, time.perf_counter() - start


def full_evaluation(sampling: Sampling, bar: StepProgress) -> tuple[EvalResult, dict[str, float]]:
    """The evaluation before and after training: every held-out prompt (the alarms' subset read from it)
    and the training sample; the result and the metrics it records."""
    result, seconds = evaluate_with(sampling, bar)
    return result, {**result.metrics(), **subset_accuracy(sampling, result), "time_eval": seconds,
                    **train_sample_accuracy(sampling, bar)}
