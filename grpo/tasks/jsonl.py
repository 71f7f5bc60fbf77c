"""The user's own training rows from a JSONL file: one {"prompt": ..., "answer": ...} object a line."""

from __future__ import annotations

import json
from pathlib import Path

from grpo.tasks.base import TaskError

REQUIRED = ("prompt", "answer")


def load_jsonl(path: str | Path) -> list[dict]:
    """Every row of a JSONL file; a bad file raises TaskError naming file:line and the field."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as err:
        raise TaskError(f"data file not found: {path}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise TaskError(f"cannot read data file {path}: {getattr(err, 'strerror', None) or err}") from err
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise TaskError(f"{path}:{number}: invalid JSON: {err.msg}") from err
        if not isinstance(row, dict):
            raise TaskError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        for field in REQUIRED:
            if field not in row:
                raise TaskError(f"{path}:{number}: missing field {field!r}")
        rows.append(row)
    if not rows:
        raise TaskError(f"data file {path} is empty")
    return rows
