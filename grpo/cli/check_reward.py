"""`grpo check-reward`: audit a reward on a dataset before training on it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from grpo.config import ConfigError


def cmd_check_reward(args: argparse.Namespace) -> int:
    """Audit each reward of --rewards on the rows its training would score: the data's rows with
    --prompt-template applied, called in --reward-style (the system prompt is not in a row: a reward
    does not see it in training either). Exits 1 when any audit fails."""
    from grpo.rewards import resolve_reward
    from grpo.rewards.sandbox import check_sandbox, needs_sandbox, set_sandbox
    from grpo.rewards.styles import check_style
    from grpo.tasks import get_task, load_rows

    if args.limit < 0 or args.workers < 0 or not 0 <= args.max_gold_failure <= 1:
        raise ConfigError("--limit and --workers must be >= 0 and --max-gold-failure in [0, 1]")
    if args.reward:
        print("grpo check-reward: --reward is deprecated: --rewards, as grpo train takes it", file=sys.stderr)
    specs = [*(args.rewards or ()), *([args.reward] if args.reward else [])]
    rewards = [resolve_reward(spec) for spec in specs] or [_own_reward(args)]
    specs = specs or [rewards[0].__name__]
    styles = [check_style(fn, args.reward_style or "auto") for fn in rewards]  # as grpo train checks them
    if needs_sandbox(rewards):  # before reading data: a missing bwrap is the first thing to know
        set_sandbox(check_sandbox(args.sandbox))
    if args.data:
        rows = load_rows(args.data, config=args.data_config, split=args.data_split, prompt_field=args.prompt_field,
                         answer_field=args.answer_field, prompt_template=args.prompt_template or "")
    else:
        rows = list(get_task(args.task).heldout)
    rows = rows[: args.limit] if args.limit else rows
    reports = [_audit(spec, reward, style, rows, args) for spec, reward, style in zip(specs, rewards, styles, strict=True)]
    print("\n\n".join(report.table() for report in reports))
    return 1 if any(report.failures() for report in reports) else 0


def _own_reward(args: argparse.Namespace) -> Callable:
    """With no --rewards, the reward grpo train would use: the task's own, math_answer for --data."""
    from grpo.rewards.math import math_answer
    from grpo.tasks import get_task

    return math_answer if args.data else get_task(args.task).reward


def _audit(spec: str, reward: Callable, style: str, rows: list, args: argparse.Namespace) -> object:
    from grpo.rewards.audit import audit_reward
    from grpo.rewards.code_audit import audit_code_reward
    from grpo.rewards.sandbox import needs_sandbox

    if needs_sandbox([reward]):
        return audit_code_reward(rows, reward=spec, workers=args.workers)
    return audit_reward(reward, rows, max_gold_failure=args.max_gold_failure, workers=args.workers, style=style)
