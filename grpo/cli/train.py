"""`grpo train` and `grpo preflight`: the config a command line means (its file and options, or the
resumed run's), the cheap checks made before anything loads, and the run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.cli.parser import flag
from grpo.config import USER_SOURCES, ConfigError, TrainConfig, load_config_file, option_fields, with_given

if TYPE_CHECKING:
    from grpo.run.build import RunSetup

# What --resume may change: how the run is kept and shown, how long it goes on, how it is spread over
# processes (--nproc, --fsdp: a checkpoint is whole, whatever wrote it), not its maths. --steps N trains on
# to step N (without --minutes, no time limit); --minutes M trains M more minutes from the resume.
RESUMABLE = ("steps", "minutes", "save_every", "keep_checkpoints", "max_bad_steps", "eval_every", "sample_every", "sandbox",
             "eval_batch_size", "save_model", "device", "threads", "fsdp", "vllm_sleep", "vllm_memory",
             "vllm_bucket_mb")


def _given_options(args: argparse.Namespace) -> dict:
    values = {f.name: getattr(args, f.name) for f in option_fields() if getattr(args, f.name) is not None}
    for key, value in values.items():
        if isinstance(value, list):
            values[key] = tuple(value)
    return values


def _config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, dict[str, str]]:
    """The config file's values (grpo's or TRL's keys, see grpo.trl_config), overridden by the options
    given on the command line; and where each given option came from (cli or file)."""
    from grpo.learning.teacher.trl import grpo_config_part, is_distillation_config, translate_config
    from grpo.trl_config import is_trl_config, trl_implied

    given = _given_options(args)
    raw = load_config_file(args.config) if args.config else {}
    values, ignored = translate_config(raw) if args.config else ({}, [])
    if {"batch_size", "prompts_per_step"} & set(given):  # either one on the command line replaces both
        values = {k: v for k, v in values.items() if k not in ("batch_size", "prompts_per_step")}
    # a TRL file gives its own keys; TRL's defaults fill the rest (source trl) without being given
    implied = (trl_implied(grpo_config_part(raw)) & set(values)) - set(given)
    config = with_given(TrainConfig.from_dict({**values, **given}), (set(values) - implied) | set(given))
    origin = {**dict.fromkeys(values, "file"), **dict.fromkeys(implied, "trl"), **dict.fromkeys(given, "cli")}
    if args.config and (is_trl_config(raw) or is_distillation_config(raw)):
        kind, unset = (("DistillationConfig", "TRL GRPOConfig's defaults (lmbda 1.0, beta 1.0, and loss_top_k 0, "
                        "the full vocabulary, not TRL's 1)") if is_distillation_config(raw)
                       else ("GRPOConfig", "TRL's defaults"))
        print(f"grpo train: {args.config} is read as a TRL {kind}: keys it leaves unset take {unset}",
              file=sys.stderr)
    if ignored:
        print(f"grpo train: warning: {args.config}: TRL keys with no meaning in grpo, ignored: {', '.join(ignored)}",
              file=sys.stderr)
    return config, origin


def _resume_config(args: argparse.Namespace) -> tuple[TrainConfig, Path, dict[str, str]]:
    """The config of the run being resumed, with the few options that may change, and where each value came
    from (the run's config.json, the changed ones from the command line)."""
    from grpo.run.checkpoint import latest, read_meta

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
        allowed = ", ".join(flag(k) for k in RESUMABLE)
        raise ConfigError(f"{flag(fixed[0])} cannot change when resuming (only {allowed} can)")
    # a run that names its steps runs them all, resumed too: --steps alone lifts the time limit (the resume's
    # rule, recorded with its source, but not a value the user gave)
    implied = {"minutes": 0.0} if "steps" in given and "minutes" not in given else {}
    saved = read_meta(path)
    kept = {k: v for k, v in saved["config"].items() if k != "set_by_user"}  # a record older runs kept
    sources = {**saved_sources(run_dir), **dict.fromkeys([*given, *implied], "resume")}
    # given: what the user gave, when the run started and now (not every key of the saved config)
    mine = [k for k, v in sources.items() if v in USER_SOURCES and k not in implied]
    config = with_given(TrainConfig.from_dict({**kept, **given, **implied}), mine)
    if config.steps < saved["step"]:
        raise ConfigError(f"--steps {config.steps} is below the step of the latest checkpoint ({saved['step']})")
    return config, run_dir, sources


def saved_sources(run_dir: Path) -> dict[str, str]:
    """The sources a run's config.json recorded ({} for a run written before they were)."""
    try:
        return dict(json.loads((run_dir / "config.json").read_text(encoding="utf-8")).get("sources", {}))
    except (OSError, ValueError, AttributeError):
        return {}


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


def resolved_text(run: RunSetup) -> str:
    """The run's resolved (and amended) configuration, its sources and what the user gave, as JSON: what
    `grpo train --nproc N` hands the processes it starts (grpo/system/launcher.py), so that they resolve nothing again."""
    return json.dumps({"config": run.config.to_dict(), "sources": run.sources, "given": sorted(run.config.given)})


def launched_config() -> tuple[TrainConfig, dict[str, str]] | None:
    """In a process `grpo train --nproc N` started: the configuration the launching process resolved, and
    where each value came from; None elsewhere (torchrun started by hand: each process resolves its own)."""
    from grpo.system.launcher import RESOLVED_ENV

    path = os.environ.get(RESOLVED_ENV)
    if not path or "WORLD_SIZE" not in os.environ:
        return None
    saved = json.loads(Path(path).read_text(encoding="utf-8"))
    return with_given(TrainConfig.from_dict(saved["config"]), saved["given"]), saved["sources"]


def run_from_args(args: argparse.Namespace, processes: int) -> tuple[RunSetup, Path | None]:
    """The run a command line means, for ``processes`` processes, resolved (grpo.config_resolution.resolve_config)
    and through every check `grpo train` makes before a weight loads but the memory check (the one that
    depends on this machine), and the resumed run's directory. tests/test_docs.py runs the docs' train
    lines through it."""
    launched = launched_config()
    if launched is not None:  # resolved once, by the command that started this process
        (config, resumed), origin, run_dir = launched, None, Path(args.resume) if args.resume else None
    elif args.resume:
        config, run_dir, resumed = _resume_config(args)
        origin = None
    else:
        (config, origin), run_dir, resumed = _config_from_args(args), None, None
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be positive, got {args.nproc}")
    from grpo.run.build import resolve_run

    # the configuration resolved, the task, the rewards, the refusals
    run = resolve_run(config, processes=processes, origin=origin, resumed=resumed)
    if config.output and run_dir is None:
        check_run_dir(Path(config.output))
        if "WORLD_SIZE" not in os.environ:  # (a launched process checks with its world, once it has one)
            refuse_used(Path(config.output))
    return run, run_dir


def refuse_used(run_dir: Path) -> None:
    """A new run's directory must not hold a run already (--dry-run refuses it too)."""
    if (run_dir / "summary.json").exists() or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"output {run_dir} already holds a run; continue it with --resume {run_dir} or choose another --output")


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    # Everything that can be checked cheaply is checked before a run directory exists.
    from grpo.refusals import world_size
    from grpo.run.build import check_before_loading
    from grpo.tasks import say_data

    run, run_dir = run_from_args(args, world_size(args.nproc))
    if "WORLD_SIZE" not in os.environ:  # once, where the command starts
        say_data(run.task)
    # once, where the command starts; the launched processes get the configuration it resolved and amended
    run = check_before_loading(run, args.nproc, resume=bool(args.resume))
    config = run.config
    if args.dry_run:
        print("\n".join(dry_run_lines(run)))
        return 0
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        from grpo.system.launcher import launch

        return launch(args.nproc, _without_nproc(argv), resolved=resolved_text(run))
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer, default_run_dir
    from grpo.system.distributed import init_world  # torch: slow to import, so after the checks

    world = init_world(config.device, fsdp=config.fsdp)
    try:
        if run_dir is None:
            run_dir = Path(str(world.broadcast_object(str(default_run_dir(config)))))  # rank 0's clock
            refuse_used(run_dir)
        setup_process(config)
        trainer = GRPOTrainer(run, progress=not args.no_progress, world=world)  # data read once
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
        print("\n".join(end_lines(summary, run_dir, saved=config.save_model)))
    return 0


def dry_run_lines(run: RunSetup) -> list[str]:
    """`grpo train --dry-run`: every option's resolved value and its source, then what may still change it
    once the model loads (grpo.run.build.pending_amendments)."""
    from grpo.run.build import pending_amendments

    values = run.config.to_dict()
    width = max(map(len, values))
    lines = [f"{name:<{width}}  {json.dumps(value)}  ({run.sources.get(name, 'default')})"
             for name, value in values.items()]
    pending = pending_amendments(run)
    lines.append("may still change once the model loads:" + ("" if pending else " nothing"))
    lines += [f"  {line}" for line in pending]
    return lines


def end_lines(summary: dict, run_dir: Path, *, saved: bool = True) -> list[str]:
    """What a run's end says: held-out accuracy before and after, where the model is (``saved``: it was
    written), why it stopped early, (when no alarm said so) that it trained on next to nothing, and the options
    that repeat it where a measurement chose them."""
    steps = summary["steps"]
    model = f"model: {run_dir / 'model'}" if saved else "no model saved (--no-save-model)"
    lines = [f"held-out accuracy {summary['heldout_accuracy_start']:.1%} -> {summary['heldout_accuracy_end']:.1%} "
             f"over {steps} step{'s' if steps != 1 else ''} in {summary['wall_seconds']:.0f} s; {model}"]
    if summary.get("stopped_early"):
        lines.append(f"stopped early after step {steps} of {summary['steps_planned']}: {summary['stopped_early']}")
    if summary.get("little_signal"):
        lines.append(summary["little_signal"])
    if summary.get("repeat"):  # what a measurement chose, as options (grpo/run/repeat.py)
        from grpo.run.repeat import as_options

        lines.append(f"repeat it step for step: {as_options(summary['repeat'])}")
    return lines


def cmd_preflight(args: argparse.Namespace) -> int:
    """`grpo preflight`: the check a run starts with, printed; nothing is trained or written."""
    from grpo.run.build import check_before_loading, resolve_run
    from grpo.tasks import say_data

    config, origin = _config_from_args(args)
    run = resolve_run(config, origin=origin)  # the configuration, the task, the rewards and the refusals, as grpo train's
    say_data(run.task)
    run = check_before_loading(run, 1)  # the memory check, as grpo train's
    config = run.config
    from grpo.run.build import step_budget
    from grpo.run.preflight import run_preflight
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    setup_process(config)
    trainer = GRPOTrainer(run, progress=False)
    try:  # the check as the trainer runs it, on its draft config
        report = run_preflight(trainer.sampling, trainer.learner, fit=trainer.fit_token_limit,
                               tuned_limit=trainer.tuned_token_limit)
    finally:
        trainer.close()
    step_budget(report, trainer.draft, set())  # what fits; nothing is changed here
    print("\n".join([report.describe(), *report.budget(trainer.draft.minutes)]))
    return 1 if report.stops("on" if config.preflight == "off" else config.preflight) else 0
