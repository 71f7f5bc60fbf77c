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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from grpo.tasks.base import RewardFn, Task, TaskError

PROMPT_FIELDS = ("prompt", "question", "problem", "instruction", "input")
ANSWER_FIELDS = ("answer", "solution", "output", "target")
_SPLIT_SEED = 1234
# A first run on a user's file, with no --steps given: up to 100 steps, but no more than 10 minutes of
# training, so that it learns or says why (alarms, pre-flight) in about the time `make train` takes.
# A run that names its steps runs them all; the token limit is fitted by the pre-flight check.
# Prompts are drawn uniformly: on a user's subtraction file (3000 rows, the embedded model, 10 minutes) the
# frontier sampler trained mostly on repeated prompts and held-out went 5.9% -> 14.8%, where uniform draws
# went 5.9% -> 25.8% (one seed each; README).
# The learning rate is a third of the built-in tasks': at 3e-5 the policy's entropy fell to about 0.1 nats
# within about ten steps and held-out accuracy rose, then oscillated; at 1e-5 files gained more on average
# in the same 10 minutes (subtraction and word problems, bench/README.md, "Figures from issue 35").
DATA_DEFAULTS = {"steps": 100, "minutes": 10.0, "sampler": "uniform", "lr": 1e-5}


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


def _is_messages(value: object) -> bool:
    """A conversational prompt: a list of {"role", "content"} messages (TRL's conversational format)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in value
    )


def _answer(record: Mapping, wanted: str, where: str, required: bool) -> str | None:
    """The answer's text: the named or detected field, or verl's ``reward_model.ground_truth``;
    None where there is none and none is required (rewards that read other fields)."""
    model = record.get("reward_model")
    detected = wanted or any(f in record for f in ANSWER_FIELDS)
    if not detected and isinstance(model, Mapping) and "ground_truth" in model:
        name, value = "reward_model.ground_truth", model["ground_truth"]
    elif required or detected:
        name = _field(record, wanted, ANSWER_FIELDS, where, "answer")
        value = record[name]
    else:
        return None
    if value is None or not str(value).strip():
        raise DataError(f"{where}: field {name!r} is empty")
    return str(value)


def _prompt(record: Mapping, field: str, where: str) -> str | list:
    value = record[field]
    if _is_messages(value):
        return list(value)
    if value is None or not str(value).strip():
        raise DataError(f"{where}: field {field!r} is empty")
    return str(value)


def all_answered(rows: Sequence[Mapping], checker: object = None) -> bool:
    """Whether every row carries what the task's ``checker`` reads: its ``reads`` attribute, else the answer (the
    built-in code task's checker reads the row's tests). Then a run's held-out accuracy is the checker on them,
    whatever rewards it trained on (grpo.setup.build_scorer), the alarms watch it, and grpo eval of the run
    scores the same."""
    field = getattr(checker, "reads", "answer")
    return bool(rows) and all(row.get(field) not in (None, "", [], ()) and str(row[field]).strip() for row in rows)


def gsm8k_answer(text: str) -> str:
    """GSM8K's final answer: what follows the last ``####``, without thousands separators."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text.rsplit("####", 1)[1]).strip()


def load_rows(
    source: str, *, prompt_field: str = "", answer_field: str = "", prompt_template: str = "",
    require_answer: bool = True,
) -> list[dict]:
    """Rows ``{"prompt", "answer", ...}`` from a data source; field names default to common ones.

    A prompt that is a list of chat messages is kept as is (conversational data); the template
    then does not apply. Without ``require_answer`` (the rewards read other fields) a row may
    have no answer, and then has no ``answer`` key.
    """
    rows = []
    for where, record in _records(source):
        name = _field(record, prompt_field, PROMPT_FIELDS, where, "prompt")
        prompt = _prompt(record, name, where)
        alpaca = name == "instruction" and not prompt_field and isinstance(prompt, str)
        if alpaca and str(record.get("input") or "").strip():  # Alpaca: the input is the instruction's context
            prompt = f"{prompt}\n\n{record['input']}"
        answer = _answer(record, answer_field, where, require_answer)
        row = {**record, "prompt": prompt}
        if answer is not None:
            row["answer"] = answer
        if "####" in row.get("answer", ""):
            row["solution"], row["answer"] = row["answer"], gsm8k_answer(row["answer"])
        if prompt_template and isinstance(prompt, str):
            try:
                row["prompt"] = prompt_template.format_map(row)
            except (KeyError, IndexError, ValueError) as err:
                raise DataError(f"{where}: prompt template needs field {err}") from None
        rows.append(row)
    if not rows:
        raise DataError(f"{source}: no rows")
    return rows


def columns(source: str) -> set[str]:
    """The field names of a data source's first row."""
    for _, record in _records(source):
        return set(record)
    return set()


def split_rows(rows: list[dict], heldout_size: int) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, held-out) by a fixed-seed shuffle; held-out at most half the rows."""
    order = list(range(len(rows)))
    random.Random(_SPLIT_SEED).shuffle(order)
    n = min(heldout_size, len(rows) // 2)
    return [rows[i] for i in order[n:]], [rows[i] for i in order[:n]]


def heldout_rows(source: str, train_source: str, heldout_size: int, **fields: object) -> list[dict]:
    """The first ``heldout_size`` rows of a separate evaluation file, read like the training data;
    a file that shares no field with the training data is an error, not an empty score."""
    if train_source:
        shared = columns(source) & columns(train_source)
        if not shared:
            raise DataError(f"{source}: shares no field with the training data {train_source} "
                            f"(it has {', '.join(sorted(columns(source))) or 'none'})")
    return load_rows(source, **fields)[:heldout_size]  # type: ignore[arg-type]


def dataset_task(
    source: str,
    *,
    reward: RewardFn,
    heldout_size: int = 256,
    prompt_field: str = "",
    answer_field: str = "",
    system_prompt: str = "",
    prompt_template: str = "",
    eval_source: str = "",
    require_answer: bool = True,
) -> Task:
    """The user's data as a task; held out: ``eval_source``'s rows, or else a split of ``source``."""
    fields = {"prompt_field": prompt_field, "answer_field": answer_field, "prompt_template": prompt_template,
              "require_answer": require_answer}
    rows = load_rows(source, **fields)
    if eval_source:
        return Task(Path(source).stem or source, rows, heldout_rows(eval_source, source, heldout_size, **fields),
                    reward, system_prompt or None, DATA_DEFAULTS)
    if len(rows) < 2:
        raise DataError(f"{source}: needs at least 2 rows (train and held-out), has {len(rows)}")
    train, heldout = split_rows(rows, heldout_size)
    return Task(Path(source).stem or source, train, heldout, reward, system_prompt or None, DATA_DEFAULTS)
