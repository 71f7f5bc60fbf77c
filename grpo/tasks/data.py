"""The user's own data: JSONL, CSV, Parquet, a saved Hugging Face dataset, a folder of split files, or a hub
dataset (grpo/tasks/sources.py opens each into its configuration's splits).

Every row becomes ``{"prompt": ..., "answer": ..., **the original fields}``.
GSM8K is recognised: an answer holding ``#### x`` becomes ``x`` with
thousands separators removed, and the worked solution stays in ``solution``.
A malformed row is an error that names the file, the line and the field.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from grpo.tasks.base import RewardFn, Task
from grpo.tasks.sources import DataError, Source, open_source

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


def _field(record: Mapping, wanted: str, defaults: tuple[str, ...], where: str, role: str) -> str:
    if wanted:
        if wanted not in record:
            raise DataError(f"{where}: missing field {wanted!r}")
        return wanted
    for name in defaults:
        if name in record:
            return name
    raise DataError(f"{where}: no {role} field (looked for {', '.join(defaults)}; set --{role}-field)")


def used_fields(record: Mapping, prompt_field: str = "", answer_field: str = "") -> tuple[str, str | None]:
    """The fields a row's prompt and answer are read from (as :func:`load_rows` picks them); None: no answer
    field (verl's ``reward_model.ground_truth`` is named as such)."""
    prompt = _field(record, prompt_field, PROMPT_FIELDS, "the first row", "prompt")
    if answer_field or any(f in record for f in ANSWER_FIELDS):
        return prompt, _field(record, answer_field, ANSWER_FIELDS, "the first row", "answer")
    model = record.get("reward_model")
    return prompt, "reward_model.ground_truth" if isinstance(model, Mapping) and "ground_truth" in model else None


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
    whatever rewards it trained on (grpo.run.build.build_scorer), the alarms watch it, and grpo eval of the run
    scores the same."""
    field = getattr(checker, "reads", "answer")
    return bool(rows) and all(row.get(field) not in (None, "", [], ()) and str(row[field]).strip() for row in rows)


def gsm8k_answer(text: str) -> str:
    """GSM8K's final answer: what follows the last ``####``, without thousands separators."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text.rsplit("####", 1)[1]).strip()


def load_rows(
    source: str, *, config: str = "", split: str = "", prompt_field: str = "", answer_field: str = "",
    prompt_template: str = "", require_answer: bool = True,
) -> list[dict]:
    """Rows ``{"prompt", "answer", ...}`` of a data source's ``split`` (default: its train split) in its
    configuration ``config``; field names default to common ones.

    A prompt that is a list of chat messages is kept as is (conversational data); the template
    then does not apply. Without ``require_answer`` (the rewards read other fields) a row may
    have no answer, and then has no ``answer`` key.
    """
    opened = open_source(source, config)
    return read_rows(opened, split or opened.train_split(), prompt_field=prompt_field, answer_field=answer_field,
                     prompt_template=prompt_template, require_answer=require_answer)


def read_rows(opened: Source, split: str, *, prompt_field: str = "", answer_field: str = "",
              prompt_template: str = "", require_answer: bool = True) -> list[dict]:
    """The rows of one split of an opened source (see :func:`load_rows`)."""
    rows = [_row(where, record, prompt_field, answer_field, prompt_template, require_answer)
            for where, record in opened.records(split)]
    if not rows:
        raise DataError(f"{opened.name}: no rows" + (f" in split {split!r}" if len(opened.splits) > 1 else ""))
    return rows


def _row(where: str, record: dict, prompt_field: str, answer_field: str, prompt_template: str,
         require_answer: bool) -> dict:
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
    return row


def _columns(opened: Source, split: str) -> set[str]:
    """The field names of a split's first row."""
    for _, record in opened.records(split):
        return set(record)
    return set()


def prompt_key(row: Mapping) -> str:
    """A row's user message as prompts are compared across splits: its words, case folded (the prompt after
    the template, as the model reads it; a conversation's user turns)."""
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        prompt = "\n".join(str(m["content"]) for m in prompt if m.get("role") == "user")
    return " ".join(prompt.split()).casefold()


def split_rows(rows: list[dict], heldout_size: int) -> tuple[list[dict], list[dict]]:
    """Disjoint (train, held-out) by a fixed-seed shuffle of the distinct prompts (:func:`prompt_key`):
    held out, at most half of them, one row each; trained on, every row of the others. A prompt the rows
    hold twice is on one side only (the copies of a held-out prompt are in neither); rows whose prompts
    all differ split as a shuffle of the rows."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(prompt_key(row), []).append(i)
    copies = list(groups.values())
    order = list(range(len(copies)))
    random.Random(_SPLIT_SEED).shuffle(order)
    n = min(heldout_size, len(copies) // 2)
    return [rows[i] for k in order[n:] for i in copies[k]], [rows[copies[k][0]] for k in order[:n]]


def remove_overlap(train: list[dict], heldout: Sequence[Mapping]) -> tuple[list[dict], int]:
    """The training rows whose prompt is not a held-out one (:func:`prompt_key`), and how many were removed."""
    held = {prompt_key(r) for r in heldout}
    kept = [r for r in train if prompt_key(r) not in held]
    return kept, len(train) - len(kept)


def duplicates(rows: Sequence[Mapping]) -> int:
    """Rows whose prompt (:func:`prompt_key`) an earlier row already has."""
    return len(rows) - len({prompt_key(r) for r in rows})


def data_splits(
    source: str, *, config: str = "", split: str = "", eval_source: str = "", eval_config: str = "",
    eval_split: str = "", heldout_size: int = 256, **fields: object,
) -> tuple[list[dict], list[dict], dict]:
    """(training rows, held-out rows, what was read) of ``source``'s ``split`` (default: train) in its
    configuration ``config``; held out: ``eval_split`` (default: test, else validation) of ``eval_source``
    (default: ``source``) in ``eval_config`` (default: ``config``), its first ``heldout_size`` rows; where
    that is the training split itself, a disjoint split of it (:func:`split_rows`). A training row whose
    prompt is in the held-out split (all of it, not only the rows scored) is removed from training."""
    opened = open_source(source, config)
    train_split = split or opened.train_split()
    rows = read_rows(opened, train_split, **fields)  # type: ignore[arg-type]
    same = eval_source in ("", source) and eval_config in ("", opened.config)
    # --data-config names the training source's configuration: another held-out source names its own
    held_config = eval_config or (config if eval_source in ("", source) else "")
    held_from = opened if same else open_source(eval_source or source, held_config)
    held_split = eval_split or held_from.eval_split(train_split if same else held_from.train_split())
    split_off = same and held_split == train_split
    if split_off:
        if len(rows) < 2:
            raise DataError(f"{source}: needs at least 2 rows (train and held-out), has {len(rows)}")
        train, heldout = split_rows(rows, heldout_size)
        removed = len(rows) - len(train) - len(heldout)
    else:
        if not same and not _columns(opened, train_split) & _columns(held_from, held_split):
            found = ", ".join(sorted(_columns(held_from, held_split))) or "none"
            raise DataError(f"{held_from.name}: shares no field with the training data {source} (it has {found})")
        every = read_rows(held_from, held_split, **fields)  # type: ignore[arg-type]
        heldout = every[:heldout_size]
        train, removed = remove_overlap(rows, every)
        if not train:
            raise DataError(f"{source}: every training prompt is in the held-out set {held_from.name} ({held_split})")
    read = {"source": source, "config": opened.config, "split": train_split, "rows": len(rows),
            "eval_source": held_from.name, "eval_config": held_from.config, "eval_split": held_split,
            "heldout_split_off": split_off, "heldout_rows": len(heldout), "train_rows": len(train),
            "overlap_removed": removed, "duplicates": duplicates(train)}
    return train, heldout, read


def describe_data(read: Mapping) -> list[str]:
    """The lines a run starts with about its data: what was read, and the overlap removed."""
    def named(source: str, config: str, split: str) -> str:
        return f"{source}" + (f" configuration {config}" if config else "") + f" split {split}"

    train = f"data: {named(read['source'], read['config'], read['split'])}, {read['rows']} rows"
    if read["heldout_split_off"]:
        held = f"held out: {read['heldout_rows']} of its prompts, split off (never trained on)"
    else:
        held = f"held out: {named(read['eval_source'], read['eval_config'], read['eval_split'])}, " \
               f"first {read['heldout_rows']} rows"
    overlap = (f"data: {read['overlap_removed']} training rows removed, their prompt being held out (case and "
               f"spacing ignored); {read['train_rows']} rows trained on, {read['duplicates']} of them a prompt "
               "seen before")
    return [f"{train}; {held}", overlap]


def say_data(task: Task) -> None:
    """Print a data source's splits as read and the overlap removed (``describe_data``), where a run starts:
    ``grpo train``, ``grpo preflight`` and ``grpo.train`` say the same lines. Nothing for a built-in task."""
    if task.data:
        print("\n".join(describe_data(task.data)), flush=True)


def heldout_rows(source: str, heldout_size: int, *, config: str = "", split: str = "", **fields: object) -> list[dict]:
    """The first ``heldout_size`` rows of a separate evaluation source's ``split`` (default: test, else
    validation, else its train split), read like the training data."""
    opened = open_source(source, config)
    return read_rows(opened, split or opened.eval_split(opened.train_split()), **fields)[:heldout_size]  # type: ignore[arg-type]


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
    config: str = "",
    split: str = "",
    eval_config: str = "",
    eval_split: str = "",
) -> Task:
    """The user's data as a task (:func:`data_splits`); what was read is its ``data``, and its resolved
    configurations and splits join its defaults (config.json records them)."""
    fields = {"prompt_field": prompt_field, "answer_field": answer_field, "prompt_template": prompt_template,
              "require_answer": require_answer}
    train, heldout, read = data_splits(source, config=config, split=split, eval_source=eval_source,
                                       eval_config=eval_config, eval_split=eval_split, heldout_size=heldout_size,
                                       **fields)
    settled = {"data_config": read["config"], "data_split": read["split"], "eval_split": read["eval_split"],
               "eval_config": read["eval_config"]}
    return Task(Path(source).stem or source, train, heldout, reward, system_prompt or None,
                {**DATA_DEFAULTS, **settled}, data=read)
