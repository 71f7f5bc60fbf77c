"""Where step metrics go: metrics.jsonl always, TensorBoard when installed."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    """Append one JSON line per step to metrics.jsonl and mirror scalars to TensorBoard."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
            except ImportError:
                self._tb = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and value is not None:
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
