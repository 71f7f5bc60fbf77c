"""`grpo`: a thin command line over the Python API.

Every TrainConfig field is a `grpo train` option (field docs are the help).
Bad input prints one line that names the problem and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

from grpo.config import ConfigError, TrainConfig


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line, without the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind = hints[f.name]
        help_text = f"{f.metadata['help']} (default: {f.default!r})"
        if kind is bool:
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:
            inner = typing.get_args(kind)[0]
            parser.add_argument(_flag(f.name), type=inner, nargs="+", default=None, help=help_text, metavar=f.name.upper())
        else:
            parser.add_argument(_flag(f.name), type=kind, default=None, help=help_text, metavar=kind.__name__.upper())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="grpo", description="Group Relative Policy Optimization on verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a model with GRPO", description="Train a model with GRPO.")
    _add_config_options(train)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev = sub.add_parser("eval", help="held-out greedy pass@1, pass@k and maj@k of a model on a task")
    ev.add_argument("--model", default="smollm2", help="model name or folder (default: smollm2)")
    ev.add_argument("--task", default="add", help="built-in task (default: add)")
    ev.add_argument("--eval-size", type=int, default=256, help="held-out prompts (default: 256)")
    ev.add_argument("--max-new-tokens", type=int, default=8, help="tokens per answer (default: 8)")
    ev.add_argument("--samples", type=int, default=4, help="n: samples per prompt for pass@k and maj@k (0: greedy only; default: 4)")
    ev.add_argument("--k", type=int, nargs="+", default=[1, 4], help="the k of pass@k and maj@k (default: 1 4)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default: 1.0)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the samples (default: 0)")
    ev.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    report = sub.add_parser("report", help="plots and an HTML page for a run, or two side by side",
                         description="Write report.png and report.html into RUN_DIR (for two runs: "
                         "report-vs-<RUN_B>.png/.html into the first). Works on a run in progress.")
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or two run directories")
    report.add_argument("--output", default=None, help="write into this folder instead")
    sub.add_parser("tasks", help="list the built-in tasks")
    return parser


def _config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name) is not None
    }
    for key, value in values.items():
        if isinstance(value, list):
            values[key] = tuple(value)
    return TrainConfig(**values)


def cmd_train(args: argparse.Namespace) -> int:
    from grpo.models import check_model
    from grpo.rewards import resolve_reward
    from grpo.tasks import get_task
    from grpo.trainer import GRPOTrainer, default_run_dir

    config = _config_from_args(args)
    # Everything that can be checked cheaply is checked before a run directory exists.
    check_model(config.model)
    get_task(config.task, heldout_size=config.eval_size)
    for spec in config.rewards:
        resolve_reward(spec)
    run_dir = default_run_dir(config)
    if (run_dir / "summary.json").exists() or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"output {run_dir} already holds a run; choose another --output")
    trainer = GRPOTrainer(config, progress=not args.no_progress)
    print(f"run directory: {run_dir}")
    summary = trainer.train(run_dir)
    print(
        f"held-out accuracy {summary['heldout_accuracy_start']:.1%} -> {summary['heldout_accuracy_end']:.1%} "
        f"over {summary['steps']} steps in {summary['wall_seconds']:.0f} s; model: {run_dir / 'model'}"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from grpo.evaluate import encode_prompts, evaluate
    from grpo.models import check_model, load_policy
    from grpo.tasks import get_task
    from grpo.trainer import pick_device

    if args.eval_size <= 0 or args.max_new_tokens <= 0:
        raise ConfigError("--eval-size and --max-new-tokens must be positive")
    if args.samples < 0 or (args.samples and not all(0 < k <= args.samples for k in args.k)):
        raise ConfigError(f"--k must lie in 1..--samples ({args.samples}), got {args.k}")
    check_model(args.model)
    task = get_task(args.task, heldout_size=args.eval_size)
    device = pick_device(args.device)
    policy = load_policy(args.model, device=device)
    prompts = encode_prompts(policy.tokenizer, [task.messages(r) for r in task.heldout])
    result = evaluate(policy.model, policy.tokenizer, prompts, task.heldout, task.reward,
                      max_new_tokens=args.max_new_tokens, samples=args.samples, ks=args.k,
                      temperature=args.temperature,
                      generator=torch.Generator(device=device).manual_seed(args.seed))
    if args.json:
        print(json.dumps({"model": args.model, "task": args.task, "heldout_size": result.size,
                          "samples": result.samples, **result.metrics()}))
    else:
        print(f"held-out {args.task}: {result.describe()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from grpo.report import write_report

    png, page = write_report(args.runs, args.output)
    print(f"wrote {png} and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from grpo.models import ModelError
    from grpo.report import ReportError
    from grpo.rewards import RewardError
    from grpo.tasks import TaskError, list_tasks

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return cmd_train(args)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "report":
            return cmd_report(args)
        print("\n".join(list_tasks()))
        return 0
    except (ConfigError, ModelError, RewardError, TaskError, ReportError) as err:
        print(f"grpo {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"grpo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
