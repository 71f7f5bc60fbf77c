"""`grpo eval`: held-out greedy pass@1, pass@k and maj@k of a model on a task or a data file, scored as
training scores it."""

from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import replace
from pathlib import Path

from grpo.config import DATA_MAX_NEW_TOKENS, ConfigError, TrainConfig

if typing.TYPE_CHECKING:
    from grpo.rewards.resolve import RewardFn
    from grpo.sampling.episodes import Agent
    from grpo.sampling.evaluate import EvalResult
    from grpo.sampling.tools import ToolBox
    from grpo.tasks import Task


# what shapes a run's prompts: grpo eval of a run's model takes each from its config.json unless given here
RENDER_FIELDS = ("task", "data", "eval_data", "eval_size", "prompt_field", "answer_field", "system_prompt",
                 "prompt_template", "prompt_format", "chat_template", "few_shot", "stop", "data_config",
                 "data_split", "eval_config", "eval_split")
SPLIT_FIELDS = ("data_config", "data_split", "eval_split")  # the options naming a part of --data


def _eval_config(args: argparse.Namespace, run: dict) -> TrainConfig:
    """The settings that render the prompts: the run's (its config.json; {} for a model no run saved), each
    one given to grpo eval winning. Its task, data and eval_size are the run's training source (where its
    few-shot examples came from); without a run, what eval is given."""
    inherited = {k: run[k] for k in RENDER_FIELDS if k in run}
    if "stop" in inherited:  # the run's format's stops among them: not carried to another format
        inherited["stop"] = tuple(inherited["stop"]) if args.prompt_format is None else ()
    if not run:
        inherited.update(task=args.task, data=args.data, eval_size=args.eval_size)
    given = {"prompt_format": args.prompt_format, "chat_template": args.chat_template, "few_shot": args.few_shot,
             "system_prompt": args.system_prompt or None, "prompt_template": args.prompt_template or None,
             "prompt_field": args.prompt_field or None, "answer_field": args.answer_field or None,
             "stop": tuple(args.stop) or None}
    if not run or args.own:  # a part of another --data than the run's is read by _data_heldout alone
        given.update({name: getattr(args, name) or None for name in SPLIT_FIELDS})
    return TrainConfig(**{**inherited, **{k: v for k, v in given.items() if v is not None}})


def _eval_task(args: argparse.Namespace, config: TrainConfig | None = None) -> Task:
    """The rows grpo eval scores: the task's held-out split, or --data's (--rows heldout: the split
    training makes, --rows first: the file's first --eval-size rows), read with ``config``'s fields and
    system prompt (the run's, see _eval_config); with few_shot, the training rows its examples come from."""
    from grpo.rewards.math import math_answer
    from grpo.tasks import Task, get_task

    config = config or _eval_config(args, {})
    if getattr(args, "own", False):  # the run's own held-out rows, built as training built them
        from grpo.tasks import load_task

        task = load_task(config.task, data=config.data, heldout_size=config.eval_size,
                         prompt_field=config.prompt_field, answer_field=config.answer_field,
                         system_prompt=config.system_prompt, prompt_template=config.prompt_template,
                         eval_data=config.eval_data, require_answer=not args.rewards, data_config=config.data_config,
                         data_split=config.data_split, eval_config=config.eval_config, eval_split=config.eval_split)
        return replace(task, heldout=task.heldout[: args.eval_size])
    if not args.data:
        task = get_task(args.task, heldout_size=args.eval_size)
        task = Task(task.name, [], task.heldout, task.reward, config.system_prompt or task.system_prompt,
                    task.defaults, task.tools, task.env)
    else:
        task = Task(Path(args.data).stem, [], _data_heldout(args, config), math_answer, config.system_prompt or None)
    if config.few_shot:  # the examples are drawn from the training rows, as training drew them
        task = replace(task, train=_training_rows(args, config))
    return task


def _data_heldout(args: argparse.Namespace, config: TrainConfig) -> list:
    """--data's rows to score, read as training reads them (--data-config, --data-split, --eval-split): --rows
    heldout, its held-out rows (the test split's first --eval-size, or the split training makes of its rows);
    --rows first, the first --eval-size rows of --eval-split (default: test, else validation, else train)."""
    from grpo.tasks import data_splits, heldout_rows

    fields = {"prompt_field": config.prompt_field, "answer_field": config.answer_field,
              "prompt_template": config.prompt_template, "require_answer": not args.rewards}
    if args.rows == "first":
        return heldout_rows(args.data, args.eval_size, config=args.data_config, split=args.eval_split, **fields)
    return data_splits(args.data, config=args.data_config, split=args.data_split, eval_split=args.eval_split,
                       heldout_size=args.eval_size, **fields)[1]


def _training_rows(args: argparse.Namespace, config: TrainConfig) -> list:
    """The rows the run trained on (before its few-shot examples left them): its data or task, split as
    training split it."""
    from grpo.sampling.prompts import run_task

    return list(run_task(replace(config, few_shot=0), require_answer=not args.rewards).train)


EPISODE_FIELDS = ("tools", "env", "max_turns", "max_episode_tokens", "turn_discount", "tool_timeout")


def _same_file(a: str, b: str) -> bool:
    return bool(a) and bool(b) and (a == b or Path(a).resolve() == Path(b).resolve())


def _inherit_source(args: argparse.Namespace, run: dict) -> None:
    """What a run's model is scored on, unless --task or --data says: the run's held-out prompts (its task's
    or data file's split, or its --eval-data file's first rows) with its --rewards (which give way to the task's
    checker where the rows carry answers, see _score_as_the_run_did). ``args.own`` says that
    eval scores the run's own held-out rows (given or inherited), built as training built them; on a split,
    never wider than the run's: the split is a fixed shuffle's first rows, a wider one holds trained prompts."""
    source = run.get("eval_data") or run.get("data", "") if run else ""  # where the run's held-out rows came from
    if run and args.task is None and not args.data:
        args.task, args.data = run.get("task", "add"), source
        args.rows = "first" if run.get("eval_data") else args.rows
        if not args.rewards and run.get("rewards"):
            args.rewards, args.reward_weights = list(run["rewards"]), list(run.get("reward_weights") or [])
            args.reward_style = run.get("reward_style", "auto")
            args.rewards_from_run = True  # kept only where the rows have no answers: see _score_as_the_run_did
    args.task = args.task or "add"
    args.own = bool(run) and args.task == run.get("task", "add") and (
        _same_file(args.data, source) if source else not args.data) and (bool(run.get("eval_data")) or args.rows == "heldout")
    run_size = run.get("eval_size") if args.own and isinstance(run.get("eval_size"), int) else None
    split = args.own and not run.get("eval_data") and args.rows == "heldout"
    if split and run_size == 0:
        raise ConfigError("the run held out no prompts (--eval-size 0): give --data FILE --rows first, or another --task")
    if split and args.eval_size and run_size and args.eval_size > run_size:
        print(f"grpo eval: scoring the run's {run_size} held-out prompts (a wider split holds prompts it "
              "trained on)", file=sys.stderr)
    args.eval_size = (min(args.eval_size or run_size, run_size) if split and run_size
                      else args.eval_size or run_size or 256)


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


def _inherit_run(args: argparse.Namespace, run: dict) -> None:
    """What a run's model takes from its run unless given: the rows it is scored on (_inherit_source) and the
    temperature of pass@k, the run's own (a hotter one would score another policy than the one trained)."""
    _inherit_source(args, run)
    if args.temperature is None:
        args.temperature = _run_temperature(args.model, run)


def _run_temperature(model: str, run: dict) -> float:
    """The temperature the run that saved ``model`` sampled at, as its own held-out pass@k did: its
    --temperature, or under --temperature-target the last logged step's; 1.0 for a model no run saved."""
    temperature = float(run.get("temperature", 1.0))
    if run.get("temperature_target"):
        metrics = Path(model).parent / "metrics.jsonl"
        for line in metrics.read_text().splitlines() if metrics.is_file() else []:
            try:
                temperature = float(json.loads(line).get("temperature", temperature))
            except (ValueError, TypeError, AttributeError):
                continue
    return temperature


def _eval_reward(args: argparse.Namespace, task: Task) -> RewardFn | None:
    """The --rewards given, or those a run trained on where the checker cannot score its rows
    (_score_as_the_run_did), called in their own style; None: the task's checker."""
    from grpo.rewards import resolve_reward
    from grpo.rewards.styles import check_style, weighted_reward

    _score_as_the_run_did(args, task)
    if not args.rewards:
        return None
    if args.reward_weights and len(args.reward_weights) != len(args.rewards):
        raise ConfigError(f"--reward-weights has {len(args.reward_weights)} entries but --rewards has {len(args.rewards)}")
    fns = [resolve_reward(spec) for spec in args.rewards]
    return weighted_reward(fns, [check_style(fn, args.reward_style) for fn in fns], args.reward_weights or None)


def _score_as_the_run_did(args: argparse.Namespace, task: Task) -> None:
    """The run's --rewards, inherited, give way to the task's checker where the rows carry answers, as the run's
    own held-out evaluation scored them: one run, one held-out figure. Rewards given to grpo eval stay."""
    from grpo.tasks import all_answered

    if getattr(args, "rewards_from_run", False) and all_answered(task.heldout, task.reward):
        args.rewards, args.reward_weights = [], []


def _check_args(args: argparse.Namespace) -> None:
    """The options' values, each refused in one line before the model loads."""
    if args.eval_size <= 0 or args.max_new_tokens < 0:
        raise ConfigError("--eval-size must be positive and --max-new-tokens >= 0")
    if args.reward_timeout <= 0:
        raise ConfigError(f"--reward-timeout must be positive, got {args.reward_timeout}")
    if args.samples < 0 or (args.samples and not all(0 < k <= args.samples for k in args.k)):
        raise ConfigError(f"--k must lie in 1..--samples ({args.samples}), got {args.k}")
    if args.temperature <= 0 and args.samples:
        raise ConfigError(f"--temperature must be > 0 to sample (--samples {args.samples}), got {args.temperature}")
    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {args.threads}")


def _check_eval_size(args: argparse.Namespace) -> None:
    """A given --eval-size below 1 is refused before anything can replace it by a default size."""
    if args.eval_size is not None and args.eval_size <= 0:
        raise ConfigError(f"--eval-size must be positive, got {args.eval_size}")


def _start_line(args: argparse.Namespace, prompts: int, limit: int) -> str | None:
    """The line on stderr before the bar: what the evaluation will score (None: no bar)."""
    if args.no_progress:
        return None
    sampled = f" then {args.samples} samples each" if args.samples else ""
    return f"grpo eval: {prompts} held-out prompts, greedy{sampled}, at most {limit} tokens a completion"


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from grpo.models import check_model, load_policy
    from grpo.observe.progress import eval_progress
    from grpo.rewards import combine_rewards
    from grpo.run.process_setup import gpu_autocast, pick_device
    from grpo.sampling.evaluate import evaluate
    from grpo.sampling.prompts import loaded_format, run_prompts, run_task

    _check_eval_size(args)
    run = _run_config(args.model)
    _inherit_run(args, run)
    _check_args(args)
    check_model(args.model)
    if args.threads:
        torch.set_num_threads(args.threads)
    # prompts as the run rendered them (its format, template, system prompt, few-shot examples, stop
    # strings), each unless given here
    config = _eval_config(args, run)
    task = _eval_task(args, config)
    given_reward = _eval_reward(args, task)  # a bad --rewards: one line, before the model
    device = pick_device(args.device)
    policy = load_policy(args.model, device="cpu")  # on the CPU until the reward and tool workers have forked (no CUDA yet)
    _, shaped, _ = loaded_format(config, {}, policy.tokenizer)  # the run's format; auto: the model's
    task = run_task(shaped, task=task)
    # in workers with a time limit, as in training: a checker that hangs on a completion scores it 0
    reward = combine_rewards([given_reward or task.reward], workers=2, timeout=args.reward_timeout)
    prompts = run_prompts(policy.tokenizer, task, shaped, task.heldout)
    limit = (args.max_new_tokens or _run_token_limit(args.model)
             or int(task.defaults.get("max_new_tokens", DATA_MAX_NEW_TOKENS)))
    agent, toolbox = _eval_agent(run, task, shaped, limit, policy.tokenizer)
    policy.model.to(device)
    said = _start_line(args, len(prompts), limit)
    try:  # greedy, then the samples: each pass advances the bar by every prompt
        with eval_progress((2 if args.samples else 1) * len(prompts), said) as advance, gpu_autocast(device):
            result = evaluate(policy.model, policy.tokenizer, prompts, task.heldout, reward,
                              max_new_tokens=limit, samples=args.samples, ks=args.k,
                              temperature=args.temperature, stop_strings=shaped.stop,
                              generator=torch.Generator(device=device).manual_seed(args.seed), agent=agent,
                              token_budget=int(run.get("micro_batch_tokens", TrainConfig.micro_batch_tokens)),
                              on_batch=advance)
    finally:
        reward.close()
        if toolbox is not None:
            toolbox.close()
    _say_result(args, result)
    return 0


def _eval_agent(run: dict, task: Task, shaped: TrainConfig, limit: int, tokenizer: object
                ) -> tuple[Agent | None, ToolBox | None]:
    """The episodes' agent and its tool workers (None, None: single-turn)."""
    from grpo.config_resolution import settle_config
    from grpo.sampling.episodes import make_agent

    # a task with tools or an environment is scored on whole episodes: with the run's own tools and turn
    # settings when the model is a run's, else the task's; its openings in the run's format and template
    same = {k: run[k] for k in EPISODE_FIELDS if k in run}
    episodes = settle_config(TrainConfig(task=task.name, max_new_tokens=limit, prompt_format=shaped.prompt_format,
                                         chat_template=shaped.chat_template, **same), task)
    return make_agent(episodes, task, tokenizer)


def _say_result(args: argparse.Namespace, result: EvalResult) -> None:
    """The evaluation's line, or with --json its record."""
    name = args.data or args.task
    if args.json:
        print(json.dumps({"model": args.model, "task": name, "heldout_size": result.size,
                          "samples": result.samples, **result.metrics()}))
    else:
        print(f"held-out {name}: {result.describe()}")
