"""`grpo`: a thin command line over the Python API.

Every TrainConfig field is a `grpo train` option (field docs are the help).
Bad input prints one line that names the problem and exits 2.

parser.py holds every subcommand's options; train.py is `grpo train` and `grpo preflight`,
eval.py `grpo eval`, check_reward.py `grpo check-reward`, data.py `grpo data`; `grpo report` and `grpo tasks`
are a few lines here, beside main, which runs one and turns the errors a user can mend into one line.
"""

from __future__ import annotations

import argparse
import os
import sys

from grpo.cli.check_reward import cmd_check_reward
from grpo.cli.data import cmd_data
from grpo.cli.eval import EPISODE_FIELDS, cmd_eval
from grpo.cli.eval import _eval_task as _eval_task  # tests reach these two through grpo.cli
from grpo.cli.eval import _run_token_limit as _run_token_limit
from grpo.cli.parser import build_parser
from grpo.cli.train import RESUMABLE, check_run_dir, cmd_preflight, cmd_train
from grpo.config import ConfigError

__all__ = ["EPISODE_FIELDS", "RESUMABLE", "build_parser", "check_run_dir", "cmd_check_reward", "cmd_data", "cmd_eval",
           "cmd_preflight", "cmd_report", "cmd_train", "main"]


def cmd_report(args: argparse.Namespace) -> int:
    from grpo.observe.report import write_report

    png, page = write_report(args.runs, args.output)
    print(f"wrote {png} and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from grpo.observe.report import ReportError
    from grpo.rewards import RewardError
    from grpo.tasks import TaskError, describe_tasks

    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return cmd_train(args, argv)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "check-reward":
            return cmd_check_reward(args)
        if args.command == "data":
            return cmd_data(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "preflight":
            return cmd_preflight(args)
        print("\n".join(describe_tasks()))
        return 0
    except (ConfigError, RewardError, TaskError, ReportError) as err:
        print(f"grpo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        return _report_stop(args.command, err)
    except KeyboardInterrupt:
        if _speaks():
            print(f"grpo {args.command}: stopped at once; the latest checkpoint (if any) is kept", file=sys.stderr)
        return 130


def _speaks() -> bool:
    """Whether this process tells how a run ended: rank 0 alone, where several run together (every one
    of them stops, and rank 0's line says where the checkpoint is)."""
    return os.environ.get("RANK", "0") == "0"


def _report_stop(command: str, err: Exception) -> int:
    """One line for the errors a run can end with (bad model, full disk, NaNs, a signal); others propagate."""
    from grpo.models import ModelError

    if isinstance(err, ModelError):
        print(f"grpo {command}: error: {err}", file=sys.stderr)
        return 2
    from grpo.run.checkpoint import CheckpointError  # torch: only once a run has started
    from grpo.sampling.episodes import EpisodeError
    from grpo.sampling.vllm_engine import EngineError
    from grpo.system.interrupt import RunStopped

    if isinstance(err, (EngineError, EpisodeError)):
        print(f"grpo {command}: error: {err}", file=sys.stderr)
        return 2
    if isinstance(err, (RunStopped, CheckpointError)):
        if _speaks() or not isinstance(err, RunStopped):
            print(f"grpo {command}: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    raise err

