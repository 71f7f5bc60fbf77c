"""Where step metrics go (metrics.jsonl always, TensorBoard by default, Weights & Biases when
installed and asked for), and the completion statistics that need the token ids."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from torch import Tensor


def repeated_ngram_frac(completion_ids: Tensor, mask: Tensor, n: int = 4) -> float:
    """Share of the completions' n-grams that repeat an earlier n-gram of the same completion.

    seq-rep-n of Welleck et al. 2019 ("Neural Text Generation with Unlikelihood
    Training", https://arxiv.org/abs/1908.04319), 1 - unique / total, pooled
    over the batch; completions shorter than n tokens contribute nothing.
    completion_ids, mask: (N, T).
    """
    total = repeated = 0
    for ids, length in zip(completion_ids.tolist(), mask.sum(dim=1).long().tolist(), strict=True):
        grams = [tuple(ids[i : i + n]) for i in range(length - n + 1)]
        total += len(grams)
        repeated += len(grams) - len(set(grams))
    return repeated / total if total else 0.0


class MetricsLogger:
    """Append one JSON line per step to metrics.jsonl; mirror scalars to TensorBoard and W&B."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, wandb: bool = False,
                 config: dict | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                self._tb = None
        self._wandb = _start_wandb(run_dir, config) if wandb else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(run_dir: Path, config: dict | None) -> object | None:
    """A W&B run named after the run directory, or None (with a warning) when wandb is not installed."""
    try:
        import wandb
    except ImportError:
        warnings.warn("wandb logging was asked for but the wandb package is not installed; skipping it",
                      stacklevel=3)
        return None
    return wandb.init(project="grpo", name=run_dir.name, dir=str(run_dir), config=config or {})


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
