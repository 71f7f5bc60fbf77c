"""The user's own data: JSONL, CSV, Parquet, a saved Hugging Face dataset, or a hub name.

Every row becomes ``{"prompt": ..., "answer": ..., **the original fields}``.
GSM8K is recognised: an answer holding ``#### x`` becomes ``x`` with
thousands separators removed, and the worked solution stays in ``solution``.
A malformed row is an error that names the file, the line and the field.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from grpo.tasks.base import RewardFn, Task, TaskError

PROMPT_FIELDS = ("prompt", "question", "problem", "input")
ANSWER_FIELDS = ("answer", "solution", "output", "target")
_SPLIT_SEED = 1234


class DataError(TaskError):
    """A dataset that cannot be read; the message names the file, line and field."""


def _jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{n}: invalid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
            yield f"{path}:{n}", record


def _csv(path: Path) -> Iterator[tuple[str, dict]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for record in reader:
            yield f"{path}:{reader.line_num}", record


def _records(source: str) -> Iterator[tuple[str, dict]]:
    """(location, record) for every row of a file, a saved dataset folder or a hub dataset."""
    path = Path(source)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            return _jsonl(path)
        if suffix == ".csv":
            return _csv(path)
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return ((f"{path}: row {i + 1}", r) for i, r in enumerate(pq.read_table(path).to_pylist()))
        raise DataError(f"{path}: unsupported data file (use .jsonl, .csv or .parquet)")
    looks_local = path.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet") or source.startswith((".", "/", "~"))
    if looks_local and not path.exists():
        raise DataError(f"data file not found: {source}")
    try:
        import datasets
    except ImportError:
        raise DataError(f"data {source!r} is not a file, and the `datasets` package is not installed") from None
    try:
        ds = datasets.load_from_disk(str(path)) if path.is_dir() else datasets.load_dataset(source, split="train")
    except Exception as err:
        raise DataError(f"cannot load dataset {source!r}: {err}") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    return ((f"{source}: row {i + 1}", dict(r)) for i, r in enumerate(ds))


def _field(record: Mapping, wanted: str, defaults: tuple[str, ...], where: str, role: str) -> str:
    if wanted:
        if wanted not in record:
            raise DataError(f"{where}: missing field {wanted!r}")
        return wanted
    for name in defaults:
        if name in record:
            return name
    raise DataError(f"{where}: no {role} field (looked for {', '.join(defaults)}; set --{role}-field)")


def gsm8k_answer(text: str) -> str:
    """GSM8K's final answer: what follows the last ``####``, without thousands separators."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text.rsplit("####", 1)[1]).strip()


def load_rows(
    source: str, *, prompt_field: str = "", answer_field: str = "", prompt_template: str = ""
) -> list[dict]:
    """Rows ``{"prompt", "answer", ...}`` from a data source; field names default to common ones."""
    rows = []
    for where, record in _records(source):
        p = _field(record, prompt_field, PROMPT_FIELDS, where, "prompt")
        a = _field(record, answer_field, ANSWER_FIELDS, where, "answer")
        prompt, answer = record[p], record[a]
        if prompt is None or not str(prompt).strip():
            raise DataError(f"{where}: field {p!r} is empty")
        if answer is None or not str(answer).strip():
            raise DataError(f"{where}: field {a!r} is empty")
        row = {**record, "prompt": str(prompt), "answer": str(answer)}
        if "####" in row["answer"]:
            row["solution"], row["answer"] = row["answer"], gsm8k_answer(row["answer"])
        if prompt_template:
            try:
                row["prompt"] = prompt_template.format_map(row)
            except (KeyError, IndexError, ValueError) as err:
                raise DataError(f"{where}: prompt template needs field {err}") from None
        rows.append(row)
    if not rows:
        raise DataError(f"{source}: no rows")
    return rows


def split_rows(rows: list[dict], heldout_size: int) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, held-out) by a fixed-seed shuffle; held-out at most half the rows."""
    order = list(range(len(rows)))
    random.Random(_SPLIT_SEED).shuffle(order)
    n = min(heldout_size, len(rows) // 2)
    return [rows[i] for i in order[n:]], [rows[i] for i in order[:n]]


def dataset_task(
    source: str,
    *,
    reward: RewardFn,
    heldout_size: int = 256,
    prompt_field: str = "",
    answer_field: str = "",
    system_prompt: str = "",
    prompt_template: str = "",
) -> Task:
    rows = load_rows(source, prompt_field=prompt_field, answer_field=answer_field, prompt_template=prompt_template)
    if len(rows) < 2:
        raise DataError(f"{source}: needs at least 2 rows (train and held-out), has {len(rows)}")
    train, heldout = split_rows(rows, heldout_size)
    return Task(Path(source).stem or source, train, heldout, reward, system_prompt or None)
