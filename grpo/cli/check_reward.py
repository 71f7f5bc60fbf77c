"""`grpo check-reward`: audit a reward on a dataset before training on it."""

from __future__ import annotations

import argparse

from grpo.config import ConfigError


def cmd_check_reward(args: argparse.Namespace) -> int:
    from grpo.rewards import resolve_reward
    from grpo.rewards.audit import audit_reward
    from grpo.rewards.code_audit import audit_code_reward
    from grpo.rewards.sandbox import check_sandbox, needs_sandbox, set_sandbox
    from grpo.tasks import get_task, load_rows

    if args.limit < 0 or args.workers < 0 or not 0 <= args.max_gold_failure <= 1:
        raise ConfigError("--limit and --workers must be >= 0 and --max-gold-failure in [0, 1]")
    reward = resolve_reward(args.reward)
    if needs_sandbox([reward]):  # before reading data: a missing bwrap is the first thing to know
        set_sandbox(check_sandbox(args.sandbox))
    if args.data:
        rows = load_rows(args.data, config=args.data_config, split=args.data_split, prompt_field=args.prompt_field,
                         answer_field=args.answer_field)
    else:
        rows = list(get_task(args.task).heldout)
    rows = rows[: args.limit] if args.limit else rows
    if needs_sandbox([reward]):
        report = audit_code_reward(rows, reward=args.reward, workers=args.workers)
    else:
        report = audit_reward(reward, rows, max_gold_failure=args.max_gold_failure, workers=args.workers)
    print(report.table())
    return 1 if report.failures() else 0
