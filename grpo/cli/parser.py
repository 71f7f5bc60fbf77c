"""The command line's shape: every subcommand and its options, and usage errors on one line.

`grpo train` and `grpo preflight` take one option per TrainConfig field, whose doc is the help.
"""

from __future__ import annotations

import argparse
import typing

from grpo.config import TrainConfig, option_fields


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

    trl = {flag(key): flag(option) for key, option in RENAMED.items()}  # TRL's names, as flags
    for word in given:
        if word.startswith("--"):
            hint = difflib.get_close_matches(word.split("=")[0], known + list(trl), n=1)
            if hint and hint[0] in trl:
                return f" (TRL's {hint[0][2:].replace('-', '_')} is {trl[hint[0]]} here)"
            if hint:
                return f" (did you mean {hint[0]}?)"
    return ""


def flag(name: str) -> str:
    """A TrainConfig field's option: max_new_tokens is --max-new-tokens."""
    return "--" + name.replace("_", "-")


# `grpo train --help` by part of the run: each TrainConfig option in exactly one section (tests/test_cli.py)
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("model", "lora_rank", "lora_alpha"),
    "data": ("task", "data", "eval_data", "data_config", "data_split", "eval_config", "eval_split", "prompt_field",
             "answer_field", "system_prompt", "prompt_template", "prompt_format", "chat_template", "few_shot"),
    "rewards": ("rewards", "reward_style", "reward_weights", "reward_timeout", "on_error", "sandbox", "tools", "env",
                "max_turns", "max_episode_tokens", "turn_discount", "tool_timeout", "env_timeout"),
    "sampling": ("prompts_per_step", "group_size", "batch_size", "max_new_tokens", "mask_truncated", "temperature",
                 "temperature_target", "top_p", "top_k", "stop", "filter_groups", "max_gen_rounds", "round_prompts",
                 "sampler", "explore_frac", "sampler_half_life", "screen", "screen_by", "screen_explore"),
    "objective": ("objective", "clip_low", "clip_high", "ratio_cap", "sapo_tau_pos", "sapo_tau_neg",
                  "advantage_estimator", "scale", "ratio_level", "aggregate", "beta", "tis_cap", "tis_level",
                  "tis_mode", "tis_low"),
    "teacher": ("teacher", "teacher_coef", "teacher_loss", "teacher_beta"),
    "schedule": ("steps", "minutes", "seed", "lr", "warmup_steps", "weight_decay", "max_grad_norm", "epochs",
                 "minibatches", "async_lag", "adapt"),
    "evaluation": ("eval_size", "eval_every", "eval_subset", "eval_train", "eval_samples", "eval_k",
                   "eval_batch_size", "preflight", "preflight_prompts"),
    "alarms": ("alarm_window", "early_stop", "no_signal_steps", "max_bad_steps"),
    "engine": ("engine", "vllm_python", "vllm_sleep", "vllm_memory", "vllm_bucket_mb", "device", "threads",
               "micro_batch_tokens", "gradient_checkpointing", "skip_zero_advantage", "heap_release_mb"),
    "processes": ("fsdp", "reward_workers"),
    "output": ("output", "save_every", "keep_checkpoints", "save_model", "sample_every", "log_every", "wandb"),
}


def _add_config_options(parser: argparse.ArgumentParser, names: typing.Iterable[str] = ()) -> dict[str, object]:
    """An option per TrainConfig field (only ``names``, when given), its doc the help; unset: None. Each in
    its section's argument group (SECTIONS); returns the groups by section."""
    hints = typing.get_type_hints(TrainConfig)
    names = set(names)
    section = {name: part for part, members in SECTIONS.items() for name in members}
    groups = {part: parser.add_argument_group(part) for part in SECTIONS
              if not names or names & set(SECTIONS[part])}
    for f in option_fields():
        if names and f.name not in names:
            continue
        kind = hints[f.name]
        group = groups[section[f.name]]
        help_text = f"{f.metadata['help']} (default: {f.default!r})"
        if kind is bool:
            group.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(kind) is tuple:
            inner = typing.get_args(kind)[0]
            group.add_argument(flag(f.name), type=inner, nargs="+", default=None, help=help_text, metavar=f.name.upper())
        else:
            group.add_argument(flag(f.name), type=kind, default=None, help=help_text, metavar=kind.__name__.upper())
    return groups


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="grpo", description="Group Relative Policy Optimization on verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    train = sub.add_parser("train", help="train a model with GRPO", description="Train a model with GRPO.")
    train.add_argument("--config", metavar="FILE", help="YAML or TOML file of options; options given here win")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    groups = _add_config_options(train)
    groups["evaluation"].add_argument("--no-preflight", dest="preflight", action="store_const", const="off",
                                      help="skip the pre-flight check (the same as --preflight off)")
    groups["output"].add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--dry-run", action="store_true",
                       help="print the resolved configuration, each value with where it came from, and what may "
                            "still change it, then exit: nothing loads, nothing is sampled (a refusal: its line, exit 2)")
    groups["processes"].add_argument(
        "--nproc", type=int, default=1, metavar="INT",
        help="data-parallel processes on this machine, started by grpo itself with torchrun's environment; "
             "Ctrl-C reaches grpo, which passes it on to each once (default: 1)")
    _add_eval(sub)
    report = sub.add_parser("report", help="an interactive HTML page and a PNG for a run, or several on one axis",
                         description="Write report.html (charts with hover and zoom, each sampled step's groups, "
                         "config; opens offline) and report.png into RUN_DIR (for several runs: "
                         "report-vs-<RUN_B>[-vs-<RUN_C>...].html/.png into the first). Works on a run in progress.")
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or more run directories")
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
    _add_data(sub)
    return parser


# grpo data reads the data as grpo train does, with these of its options
DATA_OPTIONS = ("model", "data", "eval_data", "data_config", "data_split", "eval_config", "eval_split", "eval_size",
                "prompt_field", "answer_field", "system_prompt", "prompt_template", "prompt_format", "chat_template",
                "few_shot", "rewards", "reward_style")


def _add_data(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser(
        "data", help="what grpo train would read of --data, without sampling: splits, fields, prompts, answers",
        description="Read --data as grpo train reads it, without sampling: the rows and splits read, the fields "
        "found and used, two prompts rendered as the model sees them, the answers as parsed beside their raw "
        "field, the checker's verdict on the gold answers (grpo check-reward's gold forms) and the overlap "
        "removed. Exits 1 when the gold answers fail the checker.",
    )
    _add_config_options(data, DATA_OPTIONS)
    data.add_argument("--limit", type=int, default=1000,
                      help="audit the gold answers of the first N training rows (0: all; default: 1000)")
    data.add_argument("--workers", type=int, default=2, help="reward worker processes for the audit (default: 2)")
    data.add_argument("--max-gold-failure", type=float, default=0.005,
                      help="largest allowed share of rows whose gold answer misses the maximum (default: 0.005)")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    """`grpo eval`'s options."""
    ev = sub.add_parser("eval", help="held-out greedy pass@1, pass@k and maj@k of a model on a task")
    ev.add_argument("--model", default="smollm2", help="model name or folder (default: smollm2)")
    ev.add_argument("--task", default=None,
                    help="built-in task scored without --data (default: for a model grpo train saved, the run's "
                         "task or --data file, scored as its held-out was: the task's checker, or its --rewards on rows with no "
                         "answer; else add)")
    ev.add_argument("--eval-size", type=int, default=None,
                    help="held-out prompts (default: the run's, for its own task or data, and never more: a wider "
                         "split holds prompts it trained on; else 256)")
    ev.add_argument("--max-new-tokens", type=int, default=0,
                    help="tokens per answer (default 0: for a model saved by grpo train, its run's limit from "
                         "config.json, so it scores as it trained; else the task's own setting, or 256 for --data)")
    ev.add_argument("--samples", type=int, default=4, help="n: samples per prompt for pass@k and maj@k (0: greedy only; default: 4)")
    ev.add_argument("--k", type=int, nargs="+", default=[1, 4], help="the k of pass@k and maj@k (default: 1 4)")
    ev.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature for pass@k and maj@k (default: for a model grpo train saved, the "
                         "run's: its --temperature, or under --temperature-target its last step's; else 1.0)")
    _add_eval_data_options(ev)
    ev.add_argument("--rows", choices=("heldout", "first"), default="heldout",
                    help="with --data: its held-out rows as grpo train --data holds them out with the same "
                         "--eval-size (default: the test split's first rows, else the split made of the training "
                         "rows, prompts a run did not train on), or the first --eval-size rows of --eval-split "
                         "(default: test, else validation, else train: a separate test file)")
    ev.add_argument("--prompt-format", choices=("auto", "chat", "plain", "r1-zero"), default=None,
                    help="how prompts are rendered (default: a run's own, from its config.json; else auto: the "
                         "chat template when the tokenizer has one, else plain)")
    ev.add_argument("--chat-template", default=None, help="a Jinja chat template file (default: a run's own)")
    ev.add_argument("--few-shot", type=int, default=None,
                    help="worked examples from the training rows before each prompt (default: a run's own, else 0)")
    ev.add_argument("--reward-timeout", type=float, default=30.0,
                    help="seconds one checker call may take; past it the completion scores 0 (default: 30)")
    ev.add_argument("--seed", type=int, default=0, help="seed of the samples (default: 0)")
    ev.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    ev.add_argument("--threads", type=int, default=0, metavar="INT",
                    help="CPU threads for torch, as in grpo train (default: 0, torch's default)")
    ev.add_argument("--no-progress", action="store_true", help="no progress line and bar (they go to stderr)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON (alone on stdout)")


def _add_eval_data_options(ev: argparse.ArgumentParser) -> None:
    """grpo eval reads data, prompts and rewards as training does, so a held-out file is scored as trained."""
    ev.add_argument("--data", default="", help="evaluate on this dataset file or folder instead of a task's held-out split: "
                    "the held-out split grpo train --data makes of it, or its first --eval-size rows (--rows)")
    add_split_options(ev)
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


def add_split_options(parser: argparse.ArgumentParser, *, held_out: bool = True) -> None:
    """The options naming a part of --data, as grpo train's (TrainConfig's fields of these names)."""
    parser.add_argument("--data-config", default="", help="the configuration of --data to read, for a dataset "
                        "that has several (default: its only one)")
    parser.add_argument("--data-split", default="", help="the split of --data read as training reads it "
                        "(default: train, or a dataset's only split)")
    if held_out:
        parser.add_argument("--eval-split", default="", help="the split of --data held out (default: test, else "
                            "validation, else a split of the training rows as grpo train makes it)")


def _add_check_reward(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check-reward", help="audit a reward: gold answers must score the max, exploit probes the min",
        description="Audit a reward on a dataset: every gold answer in several surface forms must score "
        "the maximum, and a bank of exploit probes must score the minimum. For code rewards (code_tests), "
        "a battery of hostile programs must score 0 and leave no trace outside the sandbox. Exits 1 on failure.",
    )
    # the options that say which reward and how it is called, and what its rows hold, as grpo train's
    _add_config_options(check, ("rewards", "reward_style", "prompt_template", "system_prompt"))
    check.add_argument("--reward", help="deprecated: --rewards")
    check.add_argument("--data", default="", help="dataset file or folder (default: the task's held-out rows)")
    add_split_options(check, held_out=False)
    check.add_argument("--task", default="add", help="built-in task when no --data (default: add)")
    check.add_argument("--prompt-field", default="", help="the data's prompt column")
    check.add_argument("--answer-field", default="", help="the data's answer column")
    check.add_argument("--limit", type=int, default=0, help="audit only the first N rows (0: all)")
    check.add_argument("--max-gold-failure", type=float, default=0.005,
                       help="largest allowed share of rows where a gold form misses the maximum (default: 0.005)")
    check.add_argument("--workers", type=int, default=2, help="reward worker processes (default: 2)")
    check.add_argument("--sandbox", default="strict", choices=("strict", "weak"),
                       help="how code rewards run untrusted code (default: strict, under bubblewrap)")
