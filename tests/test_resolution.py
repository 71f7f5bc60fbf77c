"""One configuration, resolved once before anything loads: what the user gave stands, through the command
line, a config file and Python alike; one rule fills the rest (grpo.config_resolution.resolve_config); what a run
would refuse is refused before a weight is read or a worker starts."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest
import yaml

from grpo.cli.parser import build_parser, flag
from grpo.cli.train import _config_from_args
from grpo.config import ConfigError, TrainConfig, option_fields
from grpo.config_resolution import resolve_config
from grpo.run.build import resolve_run
from grpo.tasks import get_task


def test_values_given_in_python_stand_even_at_a_default():
    """The cases of issue 51: each explicit value equal to ppo's default used to be replaced by the
    objective's recommendation, and the values an objective or estimator does not read were ignored."""
    add = get_task("add")
    gmpo, _ = resolve_config(TrainConfig(objective="gmpo", clip_low=0.2, clip_high=0.28, aggregate="token"), add)
    assert (gmpo.clip_low, gmpo.clip_high, gmpo.aggregate) == (0.2, 0.28, "token")
    sapo, _ = resolve_config(TrainConfig(objective="sapo", aggregate="token"), add)
    assert sapo.aggregate == "token"
    recommended, sources = resolve_config(TrainConfig(objective="gmpo"), add)  # nothing given: the recommendation
    assert (recommended.clip_low, recommended.clip_high, recommended.aggregate) == (0.4, 0.4, "sequence")
    assert sources["clip_low"] == sources["aggregate"] == "objective" and sources["objective"] == "python"
    with pytest.raises(ConfigError, match=r"^ratio_cap is read by objective dppo_tv or dppo_kl only"):
        resolve_config(TrainConfig(objective="ppo", ratio_cap=5.0), add)
    with pytest.raises(ConfigError, match=r"^scale is read by the grpo and passk estimators only"):
        resolve_config(TrainConfig(advantage_estimator="rloo", scale="none"), add)
    with pytest.raises(ConfigError, match=r"^ratio_cap is read"):  # given at its default: still given
        resolve_config(TrainConfig(objective="ppo", ratio_cap=20.0), add)
    with pytest.raises(ConfigError, match=r"^sapo_tau_neg is read by objective sapo only"):
        resolve_config(TrainConfig(objective="gmpo", sapo_tau_neg=1.05), add)


def test_given_is_recorded_by_the_constructor_and_carried_by_replace():
    import dataclasses

    config = TrainConfig(objective="gmpo", clip_low=0.2)
    assert config.given == {"objective", "clip_low"}
    # replace sets values without giving them (a resolution, an amendment, the prompt format): given stands,
    # unless the caller names it
    assert dataclasses.replace(config, steps=3, lr=1e-4).given == {"objective", "clip_low"}
    assert dataclasses.replace(config, steps=3, given=config.given | {"steps"}).given == {"objective", "clip_low", "steps"}
    assert TrainConfig().given == frozenset() and "given" not in config.to_dict()
    # a task's and the general defaults fill only what was not given; minutes' 0 (no limit) is a value
    add = get_task("add")
    assert resolve_config(TrainConfig(max_new_tokens=5), add)[0].max_new_tokens == 5
    assert resolve_config(TrainConfig(), add)[0].max_new_tokens == 12
    calc = get_task("calc")
    assert resolve_config(TrainConfig(), calc)[0].minutes == 10.0
    # what the resolution filled is not given (replace used to count every value it set away from the default)
    assert resolve_config(TrainConfig(objective="gmpo"), add)[0].given == {"objective"}
    assert resolve_config(TrainConfig(minutes=0), calc)[0].minutes == 0.0


# ---- every option of `grpo train`, given three ways ----

WORDS = "examples/word-problems"  # a dataset laid out as on the hub: configurations main and socratic
# For every option of `grpo train`, a second value that is neither its default nor its automatic value (a
# new option without one here fails test_the_parser_test_covers_every_option), and the options it needs
# beside it to be read at all (BESIDE: the same three ways).
SECOND = {
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "task": "countdown", "data": "examples/subtract.jsonl",
    "eval_data": "examples/subtract.jsonl", "data_config": "socratic", "data_split": "test",
    "eval_config": "socratic", "eval_split": "train", "prompt_field": "question", "answer_field": "answer",
    "system_prompt": "Be brief.", "prompt_template": "{question} Answer:", "prompt_format": "chat",
    "chat_template": "bench/tokenizer/chat_template.jinja", "few_shot": 2, "rewards": ("math_answer",),
    "reward_style": "trl", "reward_weights": (0.5,), "reward_workers": 1, "reward_timeout": 15.0,
    "on_error": "raise", "tools": "tests/combo_plugins.py:echo", "env": "tests/combo_plugins.py:Count",
    "max_turns": 3, "max_episode_tokens": 100, "turn_discount": 0.5, "tool_timeout": 5.0, "env_timeout": 15.0,
    "sandbox": "weak", "steps": 7, "minutes": 2.5, "seed": 3, "output": "runs/x", "prompts_per_step": 4,
    "group_size": 4, "batch_size": 16, "max_new_tokens": 20, "mask_truncated": True, "temperature": 0.9,
    "temperature_target": 0.5, "top_p": 0.9, "stop": ("\n\n",), "top_k": 20, "lr": 2e-5, "warmup_steps": 5,
    "weight_decay": 0.1, "max_grad_norm": 0.5, "beta": 0.04, "objective": "cispo", "clip_low": 0.1,
    "clip_high": 0.3, "ratio_cap": 10.0, "sapo_tau_pos": 0.5, "sapo_tau_neg": 0.9,
    "advantage_estimator": "rloo", "scale": "batch", "ratio_level": "sequence", "aggregate": "fixed",
    "tis_cap": 4.0, "tis_level": "sequence", "tis_mode": "mask", "tis_low": 0.5, "epochs": 2, "minibatches": 2,
    "micro_batch_tokens": 2048, "gradient_checkpointing": True, "skip_zero_advantage": False, "async_lag": 1,
    "filter_groups": False, "max_gen_rounds": 2, "round_prompts": 16, "sampler": "uniform", "explore_frac": 0.5,
    "sampler_half_life": 10.0, "screen": 4, "screen_by": "probe", "screen_explore": 0.5, "lora_rank": 8,
    "lora_alpha": 8.0, "eval_size": 64, "eval_every": 3, "eval_subset": 32, "eval_train": 8, "eval_samples": 4,
    "eval_k": (1,), "eval_batch_size": 64, "sample_every": 5, "log_every": 5, "alarm_window": 8,
    "early_stop": False, "no_signal_steps": 3, "preflight": "warn", "adapt": False, "preflight_prompts": 8,
    "wandb": True, "engine": "vllm", "vllm_python": "/usr/bin/python3", "vllm_sleep": False, "vllm_memory": 0.5,
    "vllm_bucket_mb": 512.0, "device": "cpu", "threads": 2, "heap_release_mb": 4, "save_every": 10,
    "keep_checkpoints": 3, "max_bad_steps": 2, "fsdp": True, "save_model": False,
    "teacher": "smollm2", "teacher_coef": 0.5, "teacher_loss": "full", "teacher_beta": 0.5,
}
BESIDE = {
    "data_config": {"data": WORDS}, "data_split": {"data": WORDS, "data_config": "main"},
    "eval_config": {"data": WORDS, "data_config": "main"}, "eval_split": {"data": WORDS, "data_config": "main"},
    "prompt_field": {"data": "examples/subtract.jsonl"}, "answer_field": {"data": "examples/subtract.jsonl"},
    "prompt_template": {"data": "examples/subtract.jsonl"}, "reward_weights": {"rewards": ("math_answer",)},
    "env": {"tools": "none"}, "ratio_cap": {"objective": "dppo_tv"}, "sapo_tau_pos": {"objective": "sapo"},
    "sapo_tau_neg": {"objective": "sapo"}, "ratio_level": {"objective": "ppo"}, "tis_low": {"tis_mode": "mask"},
    "batch_size": {"group_size": 8}, "round_prompts": {"prompts_per_step": 8},
    "teacher_coef": {"teacher": "smollm2"}, "teacher_loss": {"teacher": "smollm2"},
    "teacher_beta": {"teacher": "smollm2", "teacher_loss": "full"},
}
# Values equal to another objective's recommendation, or to the default, given beside an objective that
# recommends otherwise: each stands as given (they used to be replaced by the objective's recommendation).
AT_A_RECOMMENDATION = [
    ("clip_low", 0.2, {"objective": "gmpo"}), ("clip_high", 0.28, {"objective": "gmpo"}),
    ("aggregate", "token", {"objective": "gmpo"}), ("aggregate", "token", {"objective": "sapo"}),
    ("clip_low", 0.2, {"objective": "cispo"}), ("clip_high", 0.28, {"objective": "dppo_tv"}),
    ("clip_low", 0.4, {"objective": "gmpo"}), ("aggregate", "sequence", {"objective": "ppo"}),
    ("clip_high", 4.0, {"objective": "cispo"}),
]


def _options() -> list[tuple[str, object, dict]]:
    """(option, value, the options beside it) for every TrainConfig option `grpo train` takes: its default,
    its second value, and the values at an objective's recommendation."""
    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith("train"))
    dests = {a.dest for a in train._actions}
    cases = []
    for f in option_fields():
        assert f.name in dests, f"{flag(f.name)} is not an option of grpo train"
        cases.append((f.name, f.default, {}))
        if f.name in SECOND:
            cases.append((f.name, SECOND[f.name], BESIDE.get(f.name, {})))
    return cases + AT_A_RECOMMENDATION


def _cli(name: str, value: object) -> list[str]:
    if isinstance(value, bool):
        return [flag(name) if value else "--no-" + flag(name)[2:]]
    if isinstance(value, tuple):
        return [flag(name), *map(str, value)] if value else []
    return [f"{flag(name)}={value}"]


def _resolved(how, name, value, beside, tmp_path, monkeypatch):
    """The resolved config (values) and sources, or the refusal's line."""
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    given = {**beside, name: value}
    try:
        if how == "python":
            config, origin = TrainConfig(**given), None
        else:
            if how == "cli":
                argv = ["train", *(arg for key, v in given.items() for arg in _cli(key, v))]
            else:
                path = tmp_path / "c.yaml"
                path.write_text(yaml.safe_dump({k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}))
                argv = ["train", "--config", str(path)]
            if value == () and how == "cli":  # an empty list cannot be written on a command line
                return None
            config, origin = _config_from_args(build_parser().parse_args(argv))
        run = resolve_run(config, origin=origin, processes=1)
    except (ConfigError, ValueError) as err:
        return str(err)
    sources = {k: "user" if v in ("cli", "file", "python") else v for k, v in run.sources.items()}
    return run.config.to_dict(), sources


@pytest.mark.parametrize("name, value, beside", _options(), ids=lambda v: str(v)[:24])
def test_every_option_given_stands_the_same_three_ways(name, value, beside, tmp_path, monkeypatch):
    """Given on the command line, in a config file or to TrainConfig, an option's value resolves to the same
    configuration; the value stands exactly (at its default too), or all three refuse it in one line naming
    it. (A documented "automatic" value, 0 or "", or prompt_format auto, still means automatic.)"""
    results = [_resolved(how, name, value, beside, tmp_path, monkeypatch) for how in ("cli", "file", "python")]
    results = [r for r in results if r is not None]
    assert all(r == results[0] for r in results), f"{name}={value!r}: {results}"
    outcome = results[0]
    if isinstance(outcome, str):
        assert "\n" not in outcome and (name in outcome or flag(name) in outcome), f"{name}={value!r}: {outcome}"
        return
    values, sources = outcome
    automatic = value in (0, "") and not isinstance(value, bool) and name != "minutes"
    if name == "prompt_format" and value == "auto":  # the model's files decide it (source model)
        assert (values[name], sources[name]) == ("chat", "model")
    elif not automatic:
        assert values[name] == (list(value) if isinstance(value, tuple) else value), f"{name}={value!r}"
        assert sources[name] == "user"


def test_the_parser_test_covers_every_option():
    """Every option has its default and a second value that is neither the default nor automatic: an option
    added without a second value in SECOND fails here."""
    names = [f.name for f in option_fields()]
    assert sorted(SECOND) == sorted(names) and len(names) >= 100
    hints = typing.get_type_hints(TrainConfig)
    for f in option_fields():
        value = SECOND[f.name]
        assert value != f.default and (isinstance(value, bool) or value not in (0, "")), f.name
        assert isinstance(value, typing.get_origin(hints[f.name]) or hints[f.name]), f.name
    cases = _options()
    assert len(cases) == 2 * len(names) + len(AT_A_RECOMMENDATION)


# ---- refused before anything loads ----

def _adapter_folder(tmp_path) -> str:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2", "r": 4}))
    return str(folder)


def _plain_model_folder(tmp_path) -> str:
    """A model folder whose tokenizer has no chat template (the embedded model's config, no weights)."""
    from grpo.models import cache_dir

    folder = tmp_path / "base"
    folder.mkdir()
    source = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    (folder / "config.json").write_text((source / "config.json").read_text())
    tokenizer = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (folder / "model.safetensors").write_bytes(b"not weights: never opened")
    return str(folder)


# (command-line options, the line's start); {adapter} and {plain} are folders the test makes
REFUSED = [
    ("--task calc --prompt-format plain", "prompt format plain writes one question"),
    ("--task calc --prompt-format r1-zero", "prompt format r1-zero writes one question"),
    ("--task code-retry --prompt-format plain", "prompt format plain writes one question"),
    ("--task calc --model {plain}", "prompt format plain writes one question"),
    ("--model {plain} --prompt-format chat", "prompt_format chat: the model's tokenizer has no chat template"),
    ("--objective ppo --ratio-cap 5", "ratio_cap is read by objective dppo_tv or dppo_kl only"),
    ("--objective cispo --sapo-tau-pos 2", "sapo_tau_pos is read by objective sapo only"),
    ("--advantage-estimator rloo --scale none", "scale is read by the grpo and passk estimators only"),
    ("--model {adapter} --lora-rank 8", "the model is a LoRA adapter already"),
    ("--group-size 1", "group_size must be at least 2"),
    ("--batch-size 12 --group-size 8", "batch_size (12) must be a multiple of group_size (8)"),
    ("--objective cispo --ratio-level sequence", "ratio_level sequence is ppo's (GSPO)"),
    ("--tis-low 0.5", "tis_low is the lower bound of tis_mode mask"),
    ("--temperature-target 2 --async-lag 1", "temperature_target sets each step's temperature"),
    ("--few-shot 2 --prompt-format r1-zero", "few_shot: r1-zero's template is zero-shot"),
    ("--minibatches 16", "minibatches (16) cannot exceed prompts_per_step (8)"),
    ("--rewards a b --reward-weights 1", "reward_weights has 1 entries but rewards has 2"),
    ("--eval-samples 2 --eval-k 4", "eval_k must lie in 1..eval_samples (2)"),
    ("--prompt-format plain --tools none --env examples/my_reward.py:reward", "prompt format plain writes"),
]


def _to_python(args: list[str]) -> dict:
    """The options as TrainConfig's keyword arguments, parsed by grpo train's own parser."""
    parsed = build_parser().parse_args(["train", *args])
    given = {f.name: getattr(parsed, f.name) for f in option_fields() if getattr(parsed, f.name) is not None}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if a weights file is read or a worker process starts."""
    import multiprocessing.process
    import subprocess

    import safetensors
    import safetensors.torch
    import torch

    def forbidden(*args, **kwargs):
        raise AssertionError(f"loaded or started before the refusal: {args[:1]}")

    monkeypatch.setattr("grpo.models.load_policy", forbidden)
    monkeypatch.setattr("grpo.run.build.load_policy", forbidden)
    monkeypatch.setattr(safetensors, "safe_open", forbidden)
    monkeypatch.setattr(safetensors.torch, "load_file", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", forbidden)
    monkeypatch.setattr(subprocess.Popen, "__init__", forbidden)


@pytest.mark.parametrize("options, line", REFUSED, ids=[o for o, _ in REFUSED])
def test_refused_before_anything_loads_through_the_cli_and_python(options, line, tmp_path, monkeypatch, capsys,
                                                                    nothing_loads):
    import time

    import grpo
    from grpo.cli import main

    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    args = options.format(adapter=_adapter_folder(tmp_path), plain=_plain_model_folder(tmp_path)).split()
    start = time.perf_counter()
    assert main(["train", *args, "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and line in err, err
    with pytest.raises((ConfigError, ValueError)) as refused:
        grpo.train(TrainConfig(**_to_python(args)), run_dir=tmp_path / "run2", progress=False)
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert time.perf_counter() - start < 5
    assert not (tmp_path / "run").exists() and not (tmp_path / "run2").exists()


# ---- config.json: each value's source ----

def _tiny_run(tmp_path, name, config, *, memory=None, monkeypatch=None):
    """A one-step run of the tiny model; its config.json."""
    from conftest import make_model, make_tokenizer

    from grpo.run.build import check_before_loading
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    setup_process(config)
    run = resolve_run(config, model=model, processes=1)
    if memory is not None:  # what the check before loading adapts, as on a machine short of memory
        monkeypatch.setattr("grpo.run.memory_check.adapt_to_memory", lambda *a, **k: (memory, types.SimpleNamespace(host={})))
        run = check_before_loading(run, 1)
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    try:
        trainer.train(tmp_path / name)
    finally:
        trainer.close()
    return json.loads((tmp_path / name / "config.json").read_text())


TINY = dict(steps=1, prompts_per_step=2, group_size=2, eval_size=2, eval_every=-1, device="cpu", save_model=False,
            reward_workers=0, max_gen_rounds=1, preflight_prompts=2, eval_subset=2, eval_train=0)


@pytest.mark.model
def test_config_json_says_where_each_value_came_from(tmp_path, monkeypatch):
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    plain = _tiny_run(tmp_path, "default", TrainConfig(**TINY, preflight="off"))
    sources = plain["sources"]
    assert set(sources) == set(plain) - {"sources"}  # every option
    assert sources["steps"] == sources["group_size"] == "python" and sources["objective"] == "default"
    assert (sources["clip_low"], sources["aggregate"], sources["max_new_tokens"]) == ("objective", "objective", "task")
    assert (sources["lr"], plain["lr"], sources["alarm_window"]) == ("default", 3e-5, "default")

    data = _tiny_run(tmp_path, "data", TrainConfig(**TINY, data="examples/subtract.jsonl", preflight="warn"))
    assert data["sources"]["max_new_tokens"] == "preflight" and data["max_new_tokens"] <= 256  # fitted
    assert (data["sources"]["lr"], data["lr"], data["sources"]["sampler"]) == ("data", 1e-5, "data")
    assert data["sources"]["data"] == "python"

    adapted = _tiny_run(tmp_path, "memory", TrainConfig(**TINY, preflight="off"), memory={"micro_batch_tokens": 512},
                        monkeypatch=monkeypatch)
    assert adapted["micro_batch_tokens"] == 512 and adapted["sources"]["micro_batch_tokens"] == "memory"
    assert adapted["sources"]["eval_batch_size"] == "default"


@pytest.mark.model
def test_the_trainer_keeps_what_was_given():
    """The trainer settles the prompt format (and the pre-flight check's changes) through replace: what
    the user gave stays what they gave (replace used to add every value away from its default: aggregate,
    clip_low, lr, sampler, prompt_format, ...)."""
    from conftest import make_model, make_tokenizer

    from grpo.run.trainer import GRPOTrainer

    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3)
    run = resolve_run(TrainConfig(**{**TINY, "objective": "gmpo", "steps": 2}, preflight="off"), model=model,
                      processes=1)
    assert run.config.given == set(TINY) | {"objective", "preflight"}
    trainer = GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)
    try:
        assert trainer.draft.given == run.config.given
        trainer.train()
        assert trainer.config.given == run.config.given
    finally:
        trainer.close()


@pytest.mark.model
def test_the_docs_resume_example_trains_on_to_its_new_limit_after_a_budget_stop(tmp_path, capsys):
    """docs/checkpoints.md: `grpo train --resume runs/<run> --steps 60` runs on to step 60. A run stopped
    by its time budget, resumed with --steps, trains to that step (the saved seconds used to count against
    the old budget, and it stopped again after one step); --minutes on resume is that long from the resume."""
    from tiny_run import config_trainer

    from grpo.cli.train import _resume_config

    def run(config, *, resumed=None):
        trainer = config_trainer(config, resumed=resumed)
        try:
            return trainer.train(tmp_path / "run", resume=resumed is not None)
        finally:
            trainer.close()

    first = run(TrainConfig(**{**TINY, "steps": 3, "minutes": 1e-6, "preflight": "off", "save_every": 1,
                          "early_stop": False}))
    assert first["steps"] == 1 and first["out_of_time"]
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "run"), "--steps", "4"])
    config, _, sources = _resume_config(args)
    assert (config.steps, config.minutes, sources["steps"]) == (4, 0.0, "resume")
    # given: what the user gave, at the start (python) and on resume; not every key of the saved config, and
    # not the time limit --steps lifts
    assert sources["lr"] == "default" and sources["save_every"] == "python" and sources["minutes"] == "resume"
    assert config.given == {k for k, v in sources.items() if v in ("python", "resume")} - {"minutes"}
    resumed = run(config, resumed=sources)
    assert resumed["steps"] == 4 and not resumed["out_of_time"]
    args = build_parser().parse_args(["train", "--resume", str(tmp_path / "run"), "--steps", "6", "--minutes", "5"])
    config, _, sources = _resume_config(args)
    last = run(config, resumed=sources)
    assert last["steps"] == 6, {k: last[k] for k in ("out_of_time", "stopped_early", "steps_planned", "minutes")}  # 5 minutes from the resume: room for two tiny steps


def test_nproc_resolves_once_and_hands_the_processes_its_configuration_with_sources(tmp_path, monkeypatch):
    """`grpo train --nproc 2` resolves and amends once, and each process it starts reads that configuration
    with its sources: a value the memory check set is the memory check's there too (the processes used to
    get it on their command line and record it as cli). A torchrun started by hand resolves in each process."""
    from grpo.cli import main
    from grpo.cli.train import run_from_args

    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    monkeypatch.setattr("grpo.run.memory_check.adapt_to_memory",
                        lambda *a, **k: ({"micro_batch_tokens": 512}, types.SimpleNamespace(host={})))
    started = []

    class Process:
        """A process the launcher starts: its run, resolved here in its environment, instead of training."""

        returncode = 0

        def __init__(self, command, env, **kwargs):
            with monkeypatch.context() as inside:
                for key, value in env.items():
                    inside.setenv(key, value)
                started.append(run_from_args(build_parser().parse_args(command[3:]), int(env["WORLD_SIZE"]))[0])

        def poll(self):
            return 0

    monkeypatch.setattr("grpo.system.launcher.subprocess", types.SimpleNamespace(Popen=Process))
    assert main(["train", "--nproc", "2", "--steps", "3", "--output", str(tmp_path / "run")]) == 0
    assert len(started) == 2
    for run in started:
        assert run.config.micro_batch_tokens == 512 and run.sources["micro_batch_tokens"] == "memory"
        assert (run.sources["steps"], run.sources["max_new_tokens"]) == ("cli", "task")
        assert run.config.given == {"steps", "output"}  # the memory check's value is not the user's
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun by hand: nothing handed over, the command line resolved
    run, _ = run_from_args(build_parser().parse_args(["train", "--steps", "3"]), 2)
    assert run.sources["steps"] == "cli" and run.sources["micro_batch_tokens"] == "default"


# ---- grpo train --dry-run ----

def _dry_run(argv, capsys, monkeypatch):
    from grpo.cli import main

    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    code = main(["train", "--dry-run", *argv])
    return code, capsys.readouterr()


def test_dry_run_prints_the_resolved_configuration_with_sources(capsys, monkeypatch, nothing_loads):
    code, out = _dry_run([], capsys, monkeypatch)
    lines = out.out.splitlines()
    assert code == 0 and len([line for line in lines if line.endswith(")")]) == len(option_fields())
    assert any(line.split() == ["max_new_tokens", "12", "(task)"] for line in lines)
    assert any(line.split() == ["clip_high", "0.28", "(objective)"] for line in lines)
    # the page's example, line for line (docs/settings.md)
    code, out = _dry_run(["--data", "examples/subtract.jsonl", "--objective", "gmpo", "--clip-low", "0.2"],
                         capsys, monkeypatch)
    page = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "settings.md").read_text()
    shown = page.split("defaults:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert code == 0 and shown and all(line in out.out.splitlines() for line in shown)
    assert not any(line.endswith("(default)") for line in shown)


def test_dry_run_of_a_refused_combination_is_its_line_and_exit_2(capsys, monkeypatch, nothing_loads):
    code, out = _dry_run(["--task", "calc", "--prompt-format", "plain"], capsys, monkeypatch)
    assert code == 2 and out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("grpo train: error: prompt format plain writes one question")


def test_grpo_train_keyword_overrides_are_given_even_at_a_default():
    """grpo.train(config, key=value): an override stands as given, even equal to its default. ratio_cap's
    default given to ppo (which does not read it) is refused, as TrainConfig(objective="ppo", ratio_cap=...) is."""
    import grpo

    with pytest.raises(ConfigError, match="ratio_cap is read by objective"):
        grpo.train(TrainConfig(objective="ppo"), ratio_cap=TrainConfig.ratio_cap)


# ---- a previous audit's smaller cases ----

def test_a_trl_file_gives_only_its_own_keys(tmp_path, monkeypatch):
    """TRL's defaults fill what a GRPOConfig file leaves unset, with their own source trl, but are not given: a
    file with only learning_rate beside --advantage-estimator rloo used to be refused over TRL's scale."""
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    path = tmp_path / "trl.yaml"
    path.write_text("learning_rate: 2.0e-6\n")
    config, origin = _config_from_args(build_parser().parse_args(
        ["train", "--config", str(path), "--advantage-estimator", "rloo"]))
    assert config.given == {"lr", "advantage_estimator"}
    run = resolve_run(config, origin=origin, processes=1)
    assert (run.config.lr, run.sources["lr"], run.config.advantage_estimator) == (2e-6, "file", "rloo")
    assert (run.config.max_new_tokens, run.sources["max_new_tokens"]) == (256, "trl")  # TRL's, not the task's 12
    assert (run.sources["scale"], run.config.clip_high, run.sources["clip_high"]) == ("trl", 0.2, "trl")
    # TRL's batch (8 completions, groups of 8) sets prompts_per_step: its source is the batch's
    assert (run.config.prompts_per_step, run.sources["batch_size"], run.sources["prompts_per_step"]) == (1, "trl", "trl")
    path.write_text("learning_rate: 2.0e-6\nscale_rewards: none\n")  # the file's own key: given, so refused
    config, origin = _config_from_args(build_parser().parse_args(
        ["train", "--config", str(path), "--advantage-estimator", "rloo"]))
    with pytest.raises(ConfigError, match="^scale is read by the grpo and passk estimators only"):
        resolve_run(config, origin=origin, processes=1)


@pytest.mark.parametrize("name, text", [
    ("trl.yaml", "num_generations: 4\nper_device_train_batch_size: 8\n"),
    ("grpo.toml", "group_size = 4\nbatch_size = 8\n"),
    ("grpo.yaml", "group_size: 4\nbatch_size: 8\n"),
])
def test_a_files_batch_size_gives_prompts_per_step_with_the_files_source(name, text, tmp_path, monkeypatch):
    """batch_size is the other way to give prompts_per_step: a file's batch gives it, source file."""
    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    path = tmp_path / name
    path.write_text(text)
    config, origin = _config_from_args(build_parser().parse_args(["train", "--config", str(path)]))
    assert config.given == {"group_size", "batch_size"}
    run = resolve_run(config, origin=origin, processes=1)
    assert (run.config.prompts_per_step, run.sources["prompts_per_step"], run.sources["group_size"]) == (2, "file", "file")


@pytest.mark.model
def test_a_resumed_run_from_a_trl_file_counts_only_the_files_keys_as_given(tmp_path, monkeypatch):
    """TRL's defaults a TRL file fills are saved with the source trl: resumed, they are not given (saved as
    file, they were counted with the keys the user wrote)."""
    from tiny_run import config_trainer

    from grpo.cli.train import _resume_config

    monkeypatch.chdir(__file__.rsplit("/tests/", 1)[0])
    path = tmp_path / "trl.yaml"
    path.write_text("learning_rate: 2.0e-6\n")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items() if not isinstance(v, bool)]
    config, origin = _config_from_args(build_parser().parse_args(
        ["train", "--config", str(path), *flags, "--no-save-model", "--preflight", "off", "--max-new-tokens", "8"]))
    cli = {k for k, v in origin.items() if v == "cli"}
    assert config.given == {"lr"} | cli
    trainer = config_trainer(config, origin=origin)
    try:
        trainer.train(tmp_path / "run")
    finally:
        trainer.close()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["sources"]
    assert (saved["lr"], saved["scale"], saved["temperature"], saved["clip_high"]) == ("file", "trl", "trl", "trl")
    config, _, sources = _resume_config(build_parser().parse_args(["train", "--resume", str(tmp_path / "run"),
                                                                   "--steps", "2"]))
    assert config.given == {"lr", "steps"} | cli and sources["scale"] == "trl"


def test_dry_run_refuses_an_output_that_holds_a_run(tmp_path, capsys, monkeypatch, nothing_loads):
    """The refusal a run makes of a used --output, made before anything loads: --dry-run used to print the
    configuration and exit 0 for it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    code, out = _dry_run(["--output", str(tmp_path / "run")], capsys, monkeypatch)
    assert code == 2 and out.out == "" and out.err.count("\n") == 1 and "already holds a run" in out.err


@pytest.mark.parametrize("with_model", [False, True], ids=["tokenizer only", "model and tokenizer"])
def test_a_tokenizer_given_settles_the_prompt_format(with_model, tmp_path, nothing_loads):
    """grpo.train(tokenizer=...) is refused over the tokenizer it is given, with or without model= (the
    tokenizer used to be read only with a model, and without one the config's model folder answered)."""
    from conftest import make_model, make_tokenizer

    import grpo

    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    model = make_model(len(tokenizer)) if with_model else None
    with pytest.raises(ConfigError, match="^prompt_format chat: the model's tokenizer has no chat template"):
        grpo.train(TrainConfig(prompt_format="chat", device="cpu"), model=model, tokenizer=tokenizer,
                   run_dir=tmp_path / "run", progress=False)


def test_a_tokenizer_given_without_a_model_is_the_one_the_run_uses(monkeypatch):
    import torch
    from conftest import make_tokenizer

    from grpo.run.build import load_model

    mine, loaded = make_tokenizer(), make_tokenizer()
    monkeypatch.setattr("grpo.run.build.load_policy",
                        lambda name, device: types.SimpleNamespace(model="the model", tokenizer=loaded))
    assert load_model(TrainConfig(), torch.device("cpu"), None, mine) == ("the model", mine)
    assert load_model(TrainConfig(), torch.device("cpu"), None, None) == ("the model", loaded)


# ---- prompt_format auto: settled from the model's files, before anything loads ----

def _tiny_folder(tmp_path, *, chat: bool) -> str:
    """A model folder of the tests' tiny model whose tokenizer_config.json has a chat template or not (weights
    that are not weights: nothing may open them)."""
    from conftest import make_tokenizer

    folder = tmp_path / ("chat" if chat else "base")
    folder.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 103}
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    if chat:
        tokenizer["chat_template"] = make_tokenizer().chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (folder / "model.safetensors").write_bytes(b"not weights: never opened")
    return str(folder)


@pytest.fixture
def no_weights(monkeypatch, nothing_loads):
    """nothing_loads, and transformers' from_pretrained and the GGUF conversion refused too."""
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("weights loaded to settle the prompt format")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer, transformers.PreTrainedModel):
        monkeypatch.setattr(cls, "from_pretrained", forbidden)
    monkeypatch.setattr("grpo.models._convert_gguf", forbidden)


def test_the_embedded_model_resolves_to_chat_from_its_gguf_header(no_weights, tmp_path, monkeypatch):
    """The default run's prompt format is chat, from the embedded GGUF's tokenizer.chat_template, with source
    model: read before any weight (the converted folder in the cache is out of reach, so the header tells)."""
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path / "empty-cache"))
    run = resolve_run(TrainConfig(), processes=1)
    assert (run.config.prompt_format, run.sources["prompt_format"]) == ("chat", "model")
    assert (run.config.stop, run.sources["stop"]) == ((), "default")


def test_a_folder_without_a_chat_template_resolves_to_plain_with_its_stops(no_weights, tmp_path):
    run = resolve_run(TrainConfig(model=_tiny_folder(tmp_path, chat=False)), processes=1)
    assert (run.config.prompt_format, run.sources["prompt_format"]) == ("plain", "model")
    assert (run.config.stop, run.sources["stop"]) == (("\n", "Question:"), "model")
    chat = resolve_run(TrainConfig(model=_tiny_folder(tmp_path, chat=True)), processes=1)
    assert (chat.config.prompt_format, chat.sources["prompt_format"]) == ("chat", "model")


def test_an_empty_chat_template_file_is_no_template_and_a_processors_json_is_not_the_tokenizers(no_weights, tmp_path):
    """transformers reads chat_template.jinja over tokenizer_config.json (an empty one: no template, as
    save_pretrained writes for a tokenizer whose template is ""), and never a chat_template.json (a
    processor's): auto follows what the loaded tokenizer will say, not the files' names."""
    from grpo.chat_template import model_has_chat_template

    chat, base = _tiny_folder(tmp_path, chat=True), _tiny_folder(tmp_path, chat=False)
    Path(chat, "chat_template.jinja").write_text("")
    Path(base, "chat_template.json").write_text('{"chat_template": "{{ messages }}"}')
    assert (model_has_chat_template(chat), model_has_chat_template(base)) == (False, False)
    run = resolve_run(TrainConfig(model=chat), processes=1)
    assert (run.config.prompt_format, run.sources["prompt_format"]) == ("plain", "model")
    Path(base, "chat_template.jinja").write_text("{{ messages }}")
    assert model_has_chat_template(base) is True


def _gguf(path, *fields: bytes, count: int | None = None) -> str:
    import struct

    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields) if count is None else count) + b"".join(fields))
    return str(path)


def _gguf_key(name: str, kind: int, value: bytes) -> bytes:
    import struct

    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", kind) + value


def test_a_gguf_header_is_read_to_its_key_and_a_broken_one_leaves_the_tokenizer_to_decide(no_weights, tmp_path):
    """A user's GGUF: the chat template read from its header past keys of each kind; a header that runs past
    the file's end, counts more keys than it holds, or nests arrays is a ValueError (no traceback from
    resolution: auto waits on the loaded tokenizer), read without walking gigabytes."""
    import struct

    from grpo.chat_template import gguf_string, model_has_chat_template

    text = lambda s: struct.pack("<Q", len(s)) + s.encode()  # noqa: E731
    fields = [_gguf_key("general.architecture", 8, text("llama")), _gguf_key("n", 4, struct.pack("<I", 7)),
              _gguf_key("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + text("a") + text("b")),
              _gguf_key("scores", 9, struct.pack("<IQ", 6, 2) + struct.pack("<ff", 0.5, 1.5)),
              _gguf_key("tokenizer.chat_template", 8, text("{{ messages }}"))]
    good = _gguf(tmp_path / "good.gguf", *fields)
    assert gguf_string(Path(good), "tokenizer.chat_template") == "{{ messages }}"
    assert gguf_string(Path(good), "absent") is None and model_has_chat_template(good) is True
    assert model_has_chat_template(_gguf(tmp_path / "none.gguf", *fields[:4])) is False
    broken = {
        "a string longer than the file": _gguf(tmp_path / "long.gguf", struct.pack("<Q", 2**63 + 5) + b"x"),
        "more keys than bytes": _gguf(tmp_path / "count.gguf", *fields[:1], count=2**40),
        "an array of arrays": _gguf(tmp_path / "nest.gguf", _gguf_key("a", 9, struct.pack("<IQ", 9, 1) * 5000)),
        "an array longer than the file": _gguf(tmp_path / "arr.gguf", _gguf_key("a", 9, struct.pack("<IQ", 10, 2**60))),
        "cut short": _gguf(tmp_path / "cut.gguf", fields[0][:10]),
    }
    for why, path in broken.items():
        with pytest.raises((ValueError, struct.error)):
            gguf_string(Path(path), "tokenizer.chat_template")
        assert model_has_chat_template(path) is None, why
        run = resolve_run(TrainConfig(model=path), processes=1)
        assert run.config.prompt_format == "auto", why  # settled by the tokenizer once it loads


def test_a_given_format_and_stop_stand_on_a_chat_model(no_weights, capsys, monkeypatch):
    """--prompt-format plain on the (chat) embedded model stands, its stops settled at resolution after the
    user's own --stop, which keeps its source; --dry-run shows each with its source."""
    code, out = _dry_run(["--prompt-format", "plain", "--stop", "END"], capsys, monkeypatch)
    lines = [line.split() for line in out.out.splitlines()]
    assert code == 0 and ["prompt_format", '"plain"', "(cli)"] in lines
    assert ["stop", '["END",', '"\\n",', '"Question:"]', "(cli)"] in lines
    code, out = _dry_run([], capsys, monkeypatch)
    assert code == 0 and ["prompt_format", '"chat"', "(model)"] in [line.split() for line in out.out.splitlines()]
    assert "prompt_format:" not in out.out  # nothing left to settle once the model loads


def test_a_resumed_run_keeps_its_settled_format(no_weights, tmp_path):
    """A resumed run's saved configuration is not settled again: plain on the chat model stays, as saved."""
    saved = TrainConfig(prompt_format="plain", stop=("\n", "Question:"))
    run = resolve_run(saved, processes=1, resumed={"prompt_format": "model", "stop": "model"})
    assert (run.config.prompt_format, run.config.stop, run.sources["prompt_format"]) == (
        "plain", ("\n", "Question:"), "model")
