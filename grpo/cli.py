"""`grpo`: a thin command line over the Python API.

Every TrainConfig field is a `grpo train` option (field docs are the help).
Bad input prints one line that names the problem and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from pathlib import Path

from grpo.config import DATA_MAX_NEW_TOKENS, ConfigError, TrainConfig, load_config_file

if typing.TYPE_CHECKING:
    from grpo.rewards.resolve import RewardFn
    from grpo.tasks import Task


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line, without the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        if message.startswith("unrecognized arguments:"):
            message += _suggest_option(self, message.split(":", 1)[1].split())
        self.exit(2, f"{self.prog}: error: {message}\n")


def _suggest_option(parser: argparse.ArgumentParser, given: list[str]) -> str:
    """' (did you mean --x?)' for the first misspelt option, looking through the subcommands and TRL's
    names too."""
    import difflib

    known = list(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                known += list(sub._option_string_actions)
    from grpo.trl_config import RENAMED

    trl = {_flag(key): _flag(option) for key, option in RENAMED.items()}  # TRL's names, as flags
    for word in given:
        if word.startswith("--"):
            hint = difflib.get_close_matches(word.split("=")[0], known + list(trl), n=1)
            if hint and hint[0] in trl:
                return f" (TRL's {hint[0][2:].replace('-', '_')} is {trl[hint[0]]} here)"
            if hint:
                return f" (did you mean {hint[0]}?)"
    return ""


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
    train.add_argument("--config", metavar="FILE", help="YAML or TOML file of options; options given here win")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    _add_config_options(train)
    train.add_argument("--no-preflight", dest="preflight", action="store_const", const="off",
                       help="skip the pre-flight check (the same as --preflight off)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--nproc", type=int, default=1, metavar="INT",
                       help="data-parallel processes on this machine: re-runs the command under torchrun (default: 1)")
    ev = sub.add_parser("eval", help="held-out greedy pass@1, pass@k and maj@k of a model on a task")
    ev.add_argument("--model", default="smollm2", help="model name or folder (default: smollm2)")
    ev.add_argument("--task", default="add", help="built-in task (default: add)")
    ev.add_argument("--eval-size", type=int, default=256, help="held-out prompts (default: 256)")
    ev.add_argument("--max-new-tokens", type=int, default=0,
                    help="tokens per answer (default 0: for a model saved by grpo train, its run's limit from "
                         "config.json, so it scores as it trained; else the task's own setting, or 256 for --data)")
    ev.add_argument("--samples", type=int, default=4, help="n: samples per prompt for pass@k and maj@k (0: greedy only; default: 4)")
    ev.add_argument("--k", type=int, nargs="+", default=[1, 4], help="the k of pass@k and maj@k (default: 1 4)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default: 1.0)")
    _add_eval_data_options(ev)
    ev.add_argument("--rows", choices=("heldout", "first"), default="heldout",
                    help="with --data: the held-out split grpo train --data makes of the file with the same "
                         "--eval-size (default; prompts the run did not train on), or the file's first "
                         "--eval-size rows (a separate test file)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the samples (default: 0)")
    ev.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    report = sub.add_parser("report", help="plots and an HTML page for a run, or two side by side",
                         description="Write report.png and report.html into RUN_DIR (for two runs: "
                         "report-vs-<RUN_B>.png/.html into the first). Works on a run in progress.")
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or two run directories")
    report.add_argument("--output", default=None, help="write into this folder instead")
    sub.add_parser("tasks", help="list the built-in tasks with their own settings")
    pre = sub.add_parser(
        "preflight", help="sample the starting model on a few training prompts and say whether GRPO can learn",
        description="The pre-flight check on its own: pass rate, groups that vary, truncation, lengths and reward "
        "errors of the starting model, with what to try. Takes every `grpo train` option. Exits 1 when the "
        "check finds a problem that stops a run (any problem with --preflight strict).",
    )
    pre.add_argument("--config", metavar="FILE", help="YAML or TOML file of options; options given here win")
    _add_config_options(pre)
    _add_check_reward(sub)
    return parser


def _add_eval_data_options(ev: argparse.ArgumentParser) -> None:
    """grpo eval reads data, prompts and rewards as training does, so a held-out file is scored as trained."""
    ev.add_argument("--data", default="", help="evaluate on this dataset file or folder (its first --eval-size rows) instead of a task's held-out split")
    ev.add_argument("--prompt-field", default="", help="the data's prompt column")
    ev.add_argument("--answer-field", default="", help="the data's answer column")
    ev.add_argument("--system-prompt", default="", help="system message before every prompt")
    ev.add_argument("--prompt-template", default="", help="format string over the row's fields making the user message")
    ev.add_argument("--stop", nargs="+", default=[], metavar="STOP", help="stop strings, as in training")
    ev.add_argument("--rewards", nargs="+", default=[], metavar="REWARD",
                    help="score with these rewards (weighted sum; correct at >= 1.0) instead of the task's checker")
    ev.add_argument("--reward-weights", type=float, nargs="+", default=[], metavar="WEIGHT", help="one weight per reward")
    ev.add_argument("--reward-style", default="auto", choices=("auto", "grpo", "trl", "verl"),
                    help="how the rewards are called (default: auto, read from each signature)")


def _add_check_reward(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check-reward", help="audit a reward: gold answers must score the max, exploit probes the min",
        description="Audit a reward on a dataset: every gold answer in several surface forms must score "
        "the maximum, and a bank of exploit probes must score the minimum. For code rewards (code_tests), "
        "a battery of hostile programs must score 0 and leave no trace outside the sandbox. Exits 1 on failure.",
    )
    check.add_argument("--reward", required=True, help="built-in name, module:function or file.py:function")
    check.add_argument("--data", default="", help="dataset file or folder (default: the task's held-out rows)")
    check.add_argument("--task", default="add", help="built-in task when no --data (default: add)")
    check.add_argument("--prompt-field", default="", help="the data's prompt column")
    check.add_argument("--answer-field", default="", help="the data's answer column")
    check.add_argument("--limit", type=int, default=0, help="audit only the first N rows (0: all)")
    check.add_argument("--max-gold-failure", type=float, default=0.005,
                       help="largest allowed share of rows where a gold form misses the maximum (default: 0.005)")
    check.add_argument("--workers", type=int, default=2, help="reward worker processes (default: 2)")
    check.add_argument("--sandbox", default="strict", choices=("strict", "weak"),
                       help="how code rewards run untrusted code (default: strict, under bubblewrap)")


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
        rows = load_rows(args.data, prompt_field=args.prompt_field, answer_field=args.answer_field)
    else:
        rows = list(get_task(args.task).heldout)
    rows = rows[: args.limit] if args.limit else rows
    if needs_sandbox([reward]):
        report = audit_code_reward(rows, reward=args.reward, workers=args.workers)
    else:
        report = audit_reward(reward, rows, max_gold_failure=args.max_gold_failure, workers=args.workers)
    print(report.table())
    return 1 if report.failures() else 0


# What --resume may change: how the run is kept and shown, how long it goes on, how it is spread over
# processes (--nproc, --fsdp: a checkpoint is whole, whatever wrote it), not its maths.
RESUMABLE = ("steps", "minutes", "save_every", "keep_checkpoints", "max_bad_steps", "eval_every", "sample_every", "sandbox",
             "eval_batch_size", "save_model", "device", "threads", "fsdp", "vllm_sleep", "vllm_memory")


def _given_options(args: argparse.Namespace) -> dict:
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name) is not None
    }
    for key, value in values.items():
        if isinstance(value, list):
            values[key] = tuple(value)
    return values


def _config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config file's values (grpo's or TRL's keys, see grpo.trl_config), overridden by the options
    given on the command line."""
    from grpo.trl_config import is_trl_config, translate

    given = _given_options(args)
    values, ignored = translate(load_config_file(args.config)) if args.config else ({}, [])
    if {"batch_size", "prompts_per_step"} & set(given):  # either one on the command line replaces both
        values = {k: v for k, v in values.items() if k not in ("batch_size", "prompts_per_step")}
    config = TrainConfig.from_dict({**values, **given})
    if args.config and is_trl_config(load_config_file(args.config)):
        print(f"grpo train: {args.config} is read as a TRL GRPOConfig: keys it leaves unset take TRL's defaults",
              file=sys.stderr)
    if ignored:
        print(f"grpo train: warning: {args.config}: TRL keys with no meaning in grpo, ignored: {', '.join(ignored)}",
              file=sys.stderr)
    return config


def _resume_config(args: argparse.Namespace) -> tuple[TrainConfig, Path]:
    """The config of the run being resumed, with the few options that may change."""
    from grpo.checkpoint import latest, read_meta

    run_dir = Path(args.resume)
    if args.config:
        raise ConfigError("--resume continues a run with its own config; drop --config")
    if not run_dir.is_dir():
        raise ConfigError(f"cannot resume {run_dir}: no such directory")
    path = latest(run_dir)
    if path is None:
        raise ConfigError(f"cannot resume {run_dir}: not a run directory (no complete checkpoint in {run_dir / 'checkpoints'})")
    given = _given_options(args)
    fixed = [k for k in given if k not in RESUMABLE]
    if fixed:
        allowed = ", ".join(_flag(k) for k in RESUMABLE)
        raise ConfigError(f"{_flag(fixed[0])} cannot change when resuming (only {allowed} can)")
    saved = read_meta(path)
    config = TrainConfig.from_dict({**saved["config"], **given})
    if config.steps < saved["step"]:
        raise ConfigError(f"--steps {config.steps} is below the step of the latest checkpoint ({saved['step']})")
    return config, run_dir


def check_run_dir(path: Path) -> None:
    """An --output that cannot be a directory is refused before anything loads: not an existing file,
    not below one, and writable where it would be created."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output {path} is a file, not a directory")
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise ConfigError(f"output {path} cannot be a directory: {parent} is a file")
    if not os.access(path if path.exists() else parent, os.W_OK | os.X_OK):
        raise ConfigError(f"output {path} is not writable")


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _check_engine(config: TrainConfig) -> None:
    """--engine vllm: a Python that has vLLM (EngineError, one line, if not); not LoRA under FSDP."""
    if config.engine != "vllm":
        return
    if config.fsdp and config.lora_rank:
        from grpo.trainer import VLLM_FSDP_LORA

        raise ConfigError(VLLM_FSDP_LORA)
    from grpo.vllm_engine import find_python

    find_python(config.vllm_python)


def _check_user_code(config: TrainConfig, task: object) -> None:
    """The rewards resolve and fit their style, code rewards can be sandboxed, and the user's tool and
    environment files import: refused now, not at the first step."""
    from grpo.rewards import resolve_reward
    from grpo.rewards.sandbox import check_sandbox, needs_sandbox
    from grpo.rewards.styles import check_style
    from grpo.tools import load_functions

    reward_fns = [resolve_reward(spec) for spec in config.rewards] or [task.reward]
    for fn in reward_fns[: len(config.rewards)]:
        check_style(fn, config.reward_style)
    if needs_sandbox(reward_fns):
        check_sandbox(config.sandbox)
    if config.tools and config.tools != "none":
        load_functions(config.tools)
    if config.env:
        load_functions(config.env, "environment")
    # as make_agent decides: the given or the task's environment, beside the given or the task's tools
    has_env = bool(config.env) or getattr(task, "env", None) is not None
    has_tools = (config.tools not in ("", "none")) or bool(getattr(task, "tools", ()))
    if has_env and has_tools:
        raise ConfigError("give tools or an environment, not both (an environment can call tools itself)")


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    # Everything that can be checked cheaply is checked before a run directory exists.
    config, run_dir = _resume_config(args) if args.resume else (_config_from_args(args), None)
    from grpo.models import check_model
    from grpo.tasks import load_task

    check_model(config.model)
    task = load_task(config.task, data=config.data, heldout_size=config.eval_size, prompt_field=config.prompt_field,
                     answer_field=config.answer_field, system_prompt=config.system_prompt,
                     prompt_template=config.prompt_template, eval_data=config.eval_data,
                     require_answer=not config.rewards)
    _check_user_code(config, task)
    if config.output and run_dir is None:
        check_run_dir(Path(config.output))
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be positive, got {args.nproc}")
    _check_engine(config)
    from grpo.distributed import init_world, launch  # torch: slow to import, so after the checks

    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return launch(args.nproc, _without_nproc(argv))
    from grpo.process import setup_process
    from grpo.trainer import GRPOTrainer, default_run_dir

    world = init_world(config.device, fsdp=config.fsdp)
    try:
        if run_dir is None:
            run_dir = Path(str(world.broadcast_object(str(default_run_dir(config)))))  # rank 0's clock
            if (run_dir / "summary.json").exists() or (run_dir / "metrics.jsonl").exists():
                raise ConfigError(f"output {run_dir} already holds a run; continue it with --resume {run_dir} or choose another --output")
        setup_process(config)
        trainer = GRPOTrainer(config, task=task, progress=not args.no_progress, world=world)  # data read once
        if world.is_main:
            where = f"{'resuming' if args.resume else 'run directory:'} {run_dir}"
            print(where + (f" ({world.size} processes)" if world.size > 1 else ""), flush=True)
        try:
            summary = trainer.train(run_dir, resume=bool(args.resume))
        finally:
            trainer.close()
    finally:
        world.close()
    if world.is_main:
        print(
            f"held-out accuracy {summary['heldout_accuracy_start']:.1%} -> {summary['heldout_accuracy_end']:.1%} "
            f"over {summary['steps']} steps in {summary['wall_seconds']:.0f} s; model: {run_dir / 'model'}"
        )
        if summary.get("stopped_early"):
            print(f"stopped early after step {summary['steps']} of {summary['steps_planned']}: {summary['stopped_early']}")
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """`grpo preflight`: the check a run starts with, printed; nothing is trained or written."""
    from grpo.models import check_model

    config = _config_from_args(args)
    check_model(config.model)
    from grpo.preflight import run_preflight
    from grpo.trainer import GRPOTrainer

    trainer = GRPOTrainer(config, progress=False)
    try:
        report = run_preflight(trainer, fit=trainer.fit_token_limit)
    finally:
        trainer.close()
    print(report.describe())
    return 1 if report.stops("on" if config.preflight == "off" else config.preflight) else 0


def _eval_task(args: argparse.Namespace) -> Task:
    """The rows grpo eval scores: the task's held-out split, or --data's (--rows heldout: the split
    training makes, --rows first: the file's first --eval-size rows)."""
    from grpo.rewards.math import math_answer
    from grpo.tasks import Task, get_task, load_rows, split_rows

    if not args.data:
        task = get_task(args.task, heldout_size=args.eval_size)
        return Task(task.name, task.train, task.heldout, task.reward, args.system_prompt or task.system_prompt,
                    task.defaults, task.tools, task.env)
    rows = load_rows(args.data, prompt_field=args.prompt_field, answer_field=args.answer_field,
                     prompt_template=args.prompt_template, require_answer=not args.rewards)
    if len(rows) < 2 and args.rows == "heldout":
        raise ConfigError(f"{args.data}: a held-out split needs at least 2 rows; give --rows first to score it whole")
    heldout = split_rows(rows, args.eval_size)[1] if args.rows == "heldout" else rows[: args.eval_size]
    return Task(Path(args.data).stem, [], heldout, math_answer, args.system_prompt or None)


EPISODE_FIELDS = ("tools", "env", "max_turns", "max_episode_tokens", "turn_discount", "tool_timeout")


def _run_config(model: str) -> dict:
    """The config.json of the run that saved ``model`` (runs/<run>/model beside runs/<run>/config.json),
    or {} when it is not a grpo run's model."""
    config = Path(model).parent / "config.json"
    if Path(model).name != "model" or not config.is_file():
        return {}
    try:
        found = json.loads(config.read_text())
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _run_token_limit(model: str) -> int:
    """The max_new_tokens of the run that saved ``model``, or 0 when it is not a grpo run's model."""
    try:
        return int(_run_config(model).get("max_new_tokens", 0))
    except (ValueError, TypeError):
        return 0


def _eval_reward(args: argparse.Namespace, task: Task) -> RewardFn:
    """The task's checker, or the --rewards a run trained on, called in their own style."""
    from grpo.rewards import resolve_reward
    from grpo.rewards.styles import check_style, weighted_reward

    if not args.rewards:
        return task.reward
    if args.reward_weights and len(args.reward_weights) != len(args.rewards):
        raise ConfigError(f"--reward-weights has {len(args.reward_weights)} entries but --rewards has {len(args.rewards)}")
    fns = [resolve_reward(spec) for spec in args.rewards]
    return weighted_reward(fns, [check_style(fn, args.reward_style) for fn in fns], args.reward_weights or None)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from grpo.episodes import make_agent
    from grpo.evaluate import encode_prompts, evaluate
    from grpo.models import check_model, load_policy
    from grpo.trainer import pick_device, settle_config

    if args.eval_size <= 0 or args.max_new_tokens < 0:
        raise ConfigError("--eval-size must be positive and --max-new-tokens >= 0")
    if args.samples < 0 or (args.samples and not all(0 < k <= args.samples for k in args.k)):
        raise ConfigError(f"--k must lie in 1..--samples ({args.samples}), got {args.k}")
    if args.temperature <= 0 and args.samples:
        raise ConfigError(f"--temperature must be > 0 to sample (--samples {args.samples}), got {args.temperature}")
    check_model(args.model)
    task = _eval_task(args)
    reward = _eval_reward(args, task)
    device = pick_device(args.device)
    policy = load_policy(args.model, device=device)
    prompts = encode_prompts(policy.tokenizer, [task.messages(r) for r in task.heldout])
    limit = (args.max_new_tokens or _run_token_limit(args.model)
             or int(task.defaults.get("max_new_tokens", DATA_MAX_NEW_TOKENS)))
    # a task with tools or an environment is scored on whole episodes: with the run's own tools and turn
    # settings when the model is a run's, else the task's
    run = _run_config(args.model)
    same = {k: run[k] for k in EPISODE_FIELDS if k in run}
    episodes = settle_config(TrainConfig(task=task.name, max_new_tokens=limit, **same), task)
    agent, toolbox = make_agent(episodes, task, policy.tokenizer)
    try:
        result = evaluate(policy.model, policy.tokenizer, prompts, task.heldout, reward,
                          max_new_tokens=limit, samples=args.samples, ks=args.k,
                          temperature=args.temperature, stop_strings=tuple(args.stop),
                          generator=torch.Generator(device=device).manual_seed(args.seed), agent=agent)
    finally:
        if toolbox is not None:
            toolbox.close()
    name = args.data or args.task
    if args.json:
        print(json.dumps({"model": args.model, "task": name, "heldout_size": result.size,
                          "samples": result.samples, **result.metrics()}))
    else:
        print(f"held-out {name}: {result.describe()}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from grpo.report import write_report

    png, page = write_report(args.runs, args.output)
    print(f"wrote {png} and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from grpo.report import ReportError
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
        print(f"grpo {args.command}: stopped at once; the latest checkpoint (if any) is kept", file=sys.stderr)
        return 130


def _report_stop(command: str, err: Exception) -> int:
    """One line for the errors a run can end with (bad model, full disk, NaNs, a signal); others propagate."""
    from grpo.models import ModelError

    if isinstance(err, ModelError):
        print(f"grpo {command}: error: {err}", file=sys.stderr)
        return 2
    from grpo.checkpoint import CheckpointError  # torch: only once a run has started
    from grpo.interrupt import RunStopped
    from grpo.vllm_engine import EngineError

    if isinstance(err, EngineError):
        print(f"grpo {command}: error: {err}", file=sys.stderr)
        return 2
    if isinstance(err, (RunStopped, CheckpointError)):
        print(f"grpo {command}: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    raise err


if __name__ == "__main__":
    sys.exit(main())
