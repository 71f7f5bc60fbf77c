"""`grpo data`: a look at --data as grpo train reads it, before training on it, without sampling: the rows and
splits read, the fields found and used, two prompts as the model will see them, the answers as parsed beside
their raw field, the checker's verdict on the gold answers, and the overlap removed."""

from __future__ import annotations

import argparse
import time
import typing
from collections.abc import Mapping

from grpo.cli.parser import DATA_OPTIONS
from grpo.config import ConfigError, TrainConfig

if typing.TYPE_CHECKING:
    from grpo.tasks import Task

SHOWN = 2  # prompts rendered


def _data_config(args: argparse.Namespace) -> TrainConfig:
    given = {name: getattr(args, name) for name in DATA_OPTIONS if getattr(args, name) is not None}
    if not given.get("data"):
        raise ConfigError("grpo data reads --data: give a file, a folder or a dataset name")
    return TrainConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


def cmd_data(args: argparse.Namespace) -> int:
    from grpo.sampling.prompts import config_task, format_task

    if args.limit < 0 or args.workers < 0 or not 0 <= args.max_gold_failure <= 1:
        raise ConfigError("--limit and --workers must be >= 0 and --max-gold-failure in [0, 1]")
    start = time.perf_counter()
    config = _data_config(args)
    task = format_task(config_task(config, require_answer=not config.rewards), config)
    lines = [*_splits_lines(config, task.data), *_field_lines(config, task)]
    print("\n".join(lines), flush=True)
    print("\n".join(_prompt_lines(config, task)), flush=True)
    failed = _gold_lines(args, config, task)
    print(f"read in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


def _splits_lines(config: TrainConfig, read: Mapping) -> list[str]:
    """What was read, the overlap removed, and every split the source offers with its rows."""
    from grpo.tasks import describe_data
    from grpo.tasks.sources import open_source

    opened = open_source(config.data, read["config"])
    counts = ", ".join(f"{name} {sum(1 for _ in opened.records(name))}" for name in opened.splits)
    offered = f"splits of {config.data}" + (f" configuration {opened.config}" if opened.config else "")
    return [*describe_data(read), f"{offered}: {counts} rows"]


def _field_lines(config: TrainConfig, task: Task) -> list[str]:
    """The fields found in the training rows, and those the prompt and the answer came from."""
    from grpo.tasks.data import used_fields
    from grpo.tasks.sources import open_source

    opened = open_source(config.data, task.data["config"])
    _, record = next(opened.records(task.data["split"]))
    prompt, answer = used_fields(record, config.prompt_field, config.answer_field)
    return [f"fields: {', '.join(record)}; prompt from {prompt!r}"
            + (" (through --prompt-template)" if config.prompt_template else "")
            + (f", answer from {answer!r}" if answer else ", no answer field (the rewards read the row)")]


def _prompt_lines(config: TrainConfig, task: Task) -> list[str]:
    """The first training rows' prompts as the model sees them (its tokenizer, the run's format), each with
    its answer as parsed beside the raw field."""
    from transformers import AutoTokenizer

    from grpo.models import resolve_model_path
    from grpo.sampling.prompts import prompt_format, run_prompts

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(config.model))
    fmt = prompt_format(tokenizer, config.prompt_format, config.chat_template)
    rows = list(task.train[:SHOWN])
    lines = []
    for n, (row, ids) in enumerate(zip(rows, run_prompts(tokenizer, task, config, rows), strict=True), start=1):
        lines += [f"--- training prompt {n} of {len(task.train)}, format {fmt.name}, {len(ids)} tokens, as the "
                  f"model sees it:", tokenizer.decode(ids), "---"]
        if "answer" in row:
            raw = row["solution"] if "####" in str(row.get("solution", "")) else None
            lines.append(f"answer {row['answer']!r}" + (f" parsed from {' '.join(str(raw).split())!r}" if raw else ""))
    return lines


def _gold_lines(args: argparse.Namespace, config: TrainConfig, task: Task) -> bool:
    """The checker's verdict on the training rows' gold answers, in grpo check-reward's gold forms (its
    exploit probes are grpo check-reward's own); whether it failed."""
    from grpo.rewards import resolve_reward
    from grpo.rewards.audit import audit_reward
    from grpo.rewards.styles import check_style, weighted_reward
    from grpo.tasks import all_answered

    rows = list(task.train[: args.limit] if args.limit else task.train)
    if not all_answered(rows):
        print("gold answers: the rows have no answer to audit")
        return False
    fns = [resolve_reward(spec) for spec in config.rewards]
    checker = weighted_reward(fns, [check_style(fn, config.reward_style) for fn in fns], None) if fns else task.reward
    report = audit_reward(checker, rows, max_gold_failure=args.max_gold_failure, workers=args.workers,
                          exploits=False)
    print(report.table())
    return bool(report.failures())
