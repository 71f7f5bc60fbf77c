"""Each bad input: one line naming the problem, exit 2, no traceback, and no run directory left behind.

Every case runs the real command line (`python -m grpo train`) in a subprocess. None gets as far as
loading a model, so each takes a fraction of a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def grpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def place(tmp_path):
    """A folder with a stand-in model (its config.json is all the checks read) and some data files."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "broken-model").mkdir()
    (tmp_path / "broken-model" / "config.json").write_text("{not json")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "bad-json.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", answer: 4}\n')
    (tmp_path / "no-prompt.jsonl").write_text('{"query": "1+1", "answer": "2"}\n{"query": "2+2", "answer": "4"}\n')
    (tmp_path / "no-answer.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "3+3"}\n')
    (tmp_path / "typo.yaml").write_text("steps: 3\ngrop_size: 4\n")
    (tmp_path / "wrong-type.yaml").write_text("steps: ten\n")
    (tmp_path / "wrong-type.toml").write_text('lr = "fast"\n')
    (tmp_path / "broken.yaml").write_text("steps: [3\n")
    (tmp_path / "good.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    (tmp_path / "unrelated.jsonl").write_text('{"text": "hello", "label": 1}\n')
    (tmp_path / "no_import.py").write_text("import no_such_module_xyz\n")
    (tmp_path / "three_args.py").write_text("def score(a, b, c):\n    return 0.0\n")
    (tmp_path / "raising_mod.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "an_env.py").write_text("class Env:\n    def reset(self, row): ...\n    def step(self, messages): ...\n")
    (tmp_path / "trl_len.py").write_text("def reward_len(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    (tmp_path / "trl-wrong-type.yaml").write_text("learning_rate: fast\nnum_generations: 4\n")
    (tmp_path / "trl-loss.yaml").write_text("max_steps: 3\nloss_type: vespo\n")
    (tmp_path / "trl-typo.yaml").write_text("max_steps: 3\nlerning_rate: 1.0e-6\n")
    (tmp_path / "trl-epochs.yaml").write_text("num_train_epochs: 3\n")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("hello")
    return tmp_path


CASES = {
    "unknown config key": (["--config", "typo.yaml"], "unknown config key 'grop_size' (did you mean 'group_size'?)"),
    "unknown option": (["--grop-size", "4"], "unrecognized arguments: --grop-size 4 (did you mean --group-size?)"),
    "TRL's name as an option": (["--learning-rate", "1e-6"], "unrecognized arguments: --learning-rate 1e-6 (TRL's learning_rate is --lr here)"),
    "misspelt TRL name as an option": (["--num-generation", "4"], "(TRL's num_generations is --group-size here)"),
    "wrong type in yaml": (["--config", "wrong-type.yaml"], "steps must be of type int, got 'ten'"),
    "wrong type in toml": (["--config", "wrong-type.toml"], "lr must be of type float, got 'fast'"),
    "wrong type on the command line": (["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    "config file not valid yaml": (["--config", "broken.yaml"], "config file broken.yaml is not valid YAML"),
    "config file missing": (["--config", "nope.yaml"], "cannot read config file nope.yaml: No such file or directory"),
    "missing model path": (["--model", "./no-such-model"], "model path not found: ./no-such-model"),
    "unreadable model": (["--model", "broken-model"], "model folder broken-model is unreadable: config.json"),
    "model folder without config": (["--model", "not-a-run"], "model folder not-a-run has no config.json"),
    "data file missing": (["--data", "nope.jsonl"], "data file not found: nope.jsonl"),
    "data file empty": (["--data", "empty.jsonl"], "empty.jsonl: no rows"),
    "data invalid json": (["--data", "bad-json.jsonl"], "bad-json.jsonl:2: invalid JSON (Expecting property name"),
    "data without prompt": (["--data", "no-prompt.jsonl"], "no-prompt.jsonl:1: no prompt field"),
    "data without answer": (["--data", "no-answer.jsonl"], "no-answer.jsonl:2: no answer field"),
    "group size below 2": (["--group-size", "1"], "group_size must be at least 2"),
    "batch size not a multiple": (["--batch-size", "30", "--group-size", "8"], "batch_size (30) must be a multiple of group_size (8)"),
    "negative max_new_tokens": (["--max-new-tokens", "-1"], "max_new_tokens must be >= 0, got -1"),
    "unknown preflight mode": (["--preflight", "maybe"], "preflight must be one of on, warn, strict, off, got 'maybe'"),
    "eval_every below -1": (["--eval-every", "-2"], "eval_every must be -1 (never), 0 (automatic) or a number"),
    "zero no_signal_steps": (["--no-signal-steps", "0"], "no_signal_steps must be positive, got 0"),
    "negative steps": (["--steps", "-3"], "steps must be >= 0, got -3"),
    "negative minutes": (["--minutes", "-1"], "minutes must be >= 0, got -1.0"),
    "negative lr": (["--lr=-1e-5"], "lr must be >= 0, got -1e-05"),
    "unknown reward": (["--rewards", "no_such_reward"], "unknown reward 'no_such_reward'"),
    "reward file missing": (["--rewards", "nope.py:score"], "reward file not found: nope.py"),
    "resume a non-run folder": (["--resume", "not-a-run"], "cannot resume not-a-run: not a run directory"),
    "resume a missing folder": (["--resume", "gone"], "cannot resume gone: no such directory"),
    "clip_low at 1": (["--clip-low", "1.0"], "clip_low must be below 1, got 1.0"),
    "more minibatches than prompts": (["--minibatches", "9", "--prompts-per-step", "8"], "minibatches (9) cannot exceed prompts_per_step (8)"),
    "batch size contradicts prompts": (["--batch-size", "16", "--prompts-per-step", "8", "--group-size", "4"], "batch_size (16) contradicts prompts_per_step (8)"),
    "reward file does not import": (["--rewards", "no_import.py:score"], "cannot import reward file no_import.py: No module named 'no_such_module_xyz'"),
    "tool file does not import": (["--task", "calc", "--tools", "no_import.py:score"], "cannot import tool file no_import.py: No module named 'no_such_module_xyz'"),
    "environment file missing": (["--env", "nope.py:Env"], "environment file not found: nope.py"),
    "environment beside a task's tools": (["--task", "calc", "--env", "an_env.py:Env"], "give tools or an environment, not both"),
    "environment beside a task's withheld tools": (["--task", "calc", "--tools", "none", "--env", "an_env.py:Env"], "give tools or an environment, not both"),
    "reward module that raises on import": (["--rewards", "raising_mod:f"], "cannot import reward module 'raising_mod': boom at import"),
    "reward with no module": (["--rewards", ":f"], "reward '': name a .py file or an importable module before the colon"),
    "reward of no accepted form": (["--rewards", "three_args.py:score"], "reward score fits no accepted signature (grpo: fn(completion, example)"),
    "reward of another style than stated": (["--rewards", "trl_len.py:reward_len", "--reward-style", "verl"], "reward reward_len does not fit the verl style"),
    "unknown reward style": (["--reward-style", "openrlhf"], "reward_style must be one of auto, grpo, trl, verl, got 'openrlhf'"),
    "TRL key of the wrong type": (["--config", "trl-wrong-type.yaml"], "learning_rate must be of type float, got 'fast'"),
    "TRL loss type grpo lacks": (["--config", "trl-loss.yaml"], "loss_type 'vespo' is not supported by grpo"),
    "misspelt TRL key": (["--config", "trl-typo.yaml"], "unknown config key 'lerning_rate' (did you mean 'learning_rate'?)"),
    "TRL epochs instead of steps": (["--config", "trl-epochs.yaml"], "num_train_epochs: grpo counts steps, not epochs; set max_steps instead"),
    "eval data shares no field": (["--data", "good.jsonl", "--eval-data", "unrelated.jsonl"], "unrelated.jsonl: shares no field with the training data good.jsonl"),
    "eval data missing": (["--data", "good.jsonl", "--eval-data", "nope.jsonl"], "data file not found: nope.jsonl"),
    "output is a file": (["--output", "not-a-run/notes.txt"], "output not-a-run/notes.txt is a file, not a directory"),
    "output below a file": (["--output", "not-a-run/notes.txt/run"], "output not-a-run/notes.txt/run cannot be a directory: not-a-run/notes.txt is a file"),
    "weights without rewards": (["--reward-weights", "1.0", "2.0"], "reward_weights has 2 entries but rewards has 0"),
    "unknown engine": (["--engine", "sglang"], "engine must be one of own, vllm, got 'sglang'"),
    "vllm memory above 1": (["--engine", "vllm", "--vllm-memory", "1.5"], "vllm_memory must be in [0, 1] (0: sized for the run), got 1.5"),
    "vllm without its Python": (["--engine", "vllm", "--vllm-python", "./no-such-python"],
                                "--engine vllm: no Python at ./no-such-python; run `make vllm`"),
    "vllm not installed": (["--engine", "vllm", "--vllm-python", sys.executable],
                           "--engine vllm: vLLM is not installed for " + sys.executable + "; run `make vllm`"),
    "prompts not divisible among the processes": (["--prompts-per-step", "3", "--group-size", "2", "--nproc", "2"],
                                                  "prompts_per_step (3) must be divisible by the number of processes (2)"),
    "vllm with LoRA under FSDP": (["--engine", "vllm", "--fsdp", "--lora-rank", "8", "--nproc", "2"],
                                  "engine vllm with LoRA under FSDP is not built: drop --fsdp"),
    "tis cap at 1": (["--tis-cap", "1.0"], "tis_cap must be above 1 (or 0: off), got 1.0"),
    "unknown tis level": (["--tis-level", "batch"], "tis_level must be one of token, sequence, sequence_ratio, got 'batch'"),
    "unknown objective": (["--objective", "vespo"], "objective must be one of ppo, cispo, sapo, gmpo, dppo_tv, dppo_kl, got 'vespo'"),
    "unknown estimator": (["--advantage-estimator", "opo"], "advantage_estimator must be one of grpo, rloo, reinforce_pp, "
                                                             "reinforce_pp_baseline, passk, got 'opo'"),
    "tis low under truncation": (["--tis-low", "0.5"], "tis_low is the lower bound of tis_mode mask"),
    "gspo ratio with cispo": (["--objective", "cispo", "--ratio-level", "sequence"], "ratio_level sequence is ppo's (GSPO)"),
}


@pytest.mark.parametrize("args, message", CASES.values(), ids=CASES.keys())
def test_bad_input_is_one_clear_line(place, args, message):
    output = [] if "--output" in args else ["--output", "run"]
    result = grpo("train", "--model", "model", *args, *output, cwd=place)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (place / "run").exists()
    assert not (place / "not-a-run" / "checkpoints").exists()


# What grpo.run.build.resolve_run refuses (the model, the task, the rewards, tools and environments, the engine):
# `grpo preflight` and grpo.train() refuse it as `grpo train` does, before a model loads.
SETUP_CASES = {name: CASES[name] for name in (
    "missing model path", "unreadable model", "model folder without config", "data file missing",
    "data without answer", "eval data shares no field", "unknown reward", "reward file does not import",
    "reward of another style than stated", "tool file does not import", "environment file missing",
    "environment beside a task's tools", "environment beside a task's withheld tools", "vllm without its Python",
    "vllm not installed")}


@pytest.mark.parametrize("args, message", SETUP_CASES.values(), ids=SETUP_CASES.keys())
def test_preflight_refuses_bad_input_as_train_does(place, args, message):
    result = grpo("preflight", "--model", "model", *args, cwd=place)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


PYTHON_CASES = {
    "missing model path": ({"model": "./no-such-model"}, "model path not found: ./no-such-model"),
    "tool file does not import": ({"task": "calc", "tools": "no_import.py:score"},
                                  "cannot import tool file no_import.py: No module named 'no_such_module_xyz'"),
    "environment file missing": ({"env": "nope.py:Env"}, "environment file not found: nope.py"),
    "environment beside a task's tools": ({"task": "calc", "env": "an_env.py:Env"},
                                          "give tools or an environment, not both"),
    "reward of another style than stated": ({"rewards": ("trl_len.py:reward_len",), "reward_style": "verl"},
                                            "reward reward_len does not fit the verl style"),
    "vllm without its Python": ({"engine": "vllm", "vllm_python": "./no-such-python"},
                                "--engine vllm: no Python at ./no-such-python; run `make vllm`"),
    "prompts not divisible among the processes": ({"prompts_per_step": 3, "group_size": 2},
                                                  "prompts_per_step (3) must be divisible by the number of processes (2)"),
}


@pytest.mark.parametrize("options, message", PYTHON_CASES.values(), ids=PYTHON_CASES.keys())
def test_grpo_train_refuses_bad_input_as_the_command_does(place, monkeypatch, options, message):
    import re

    import grpo

    monkeypatch.chdir(place)
    monkeypatch.setenv("WORLD_SIZE", "2")  # the world size the refusals are for; none gets as far as starting it
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(Exception, match=re.escape(message)):  # the CLI's one line is this exception's text
        grpo.train(grpo.TrainConfig(**{"model": "model", "device": "cpu", **options}), progress=False)


def test_existing_run_is_not_overwritten(place):
    run = place / "run"
    (run / "checkpoints" / "step-00000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    result = grpo("train", "--model", "model", "--output", "run", cwd=place)
    assert result.returncode == 2
    assert "output run already holds a run; continue it with --resume run" in result.stderr
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("command", [["train", "--model", "model", "--task", "code", "--output", "run"],
                                     ["check-reward", "--rewards", "code_tests", "--task", "code"]])
def test_code_rewards_refuse_to_start_without_bubblewrap(place, command):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(place / "no-bwrap-here")}
    result = subprocess.run([sys.executable, "-m", "grpo", *command], cwd=place, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "bwrap is not installed" in lines[0] and "`bubblewrap`" in lines[0] and "--sandbox weak" in lines[0]
    assert not (place / "run").exists()


def test_unknown_sandbox_mode_is_one_clear_line(place):
    result = grpo("train", "--model", "model", "--task", "code", "--sandbox", "loose", "--output", "run", cwd=place)
    assert result.returncode == 2
    assert "sandbox must be one of strict, weak, got 'loose'" in result.stderr


EVAL_CASES = {
    "data missing": (["--data", "nope.jsonl"], "data file not found: nope.jsonl"),
    "data without prompt": (["--data", "no-prompt.jsonl"], "no-prompt.jsonl:1: no prompt field"),
    "reward file does not import": (["--rewards", "no_import.py:score"], "cannot import reward file no_import.py"),
    "reward of no accepted form": (["--rewards", "three_args.py:score"], "fits no accepted signature"),
    "weights of the wrong count": (["--rewards", "trl_len.py:reward_len", "--reward-weights", "1", "2"],
                                   "--reward-weights has 2 entries but --rewards has 1"),
    "greedy temperature with samples": (["--temperature", "0"], "--temperature must be > 0 to sample"),
}


@pytest.mark.parametrize("args, message", EVAL_CASES.values(), ids=EVAL_CASES.keys())
def test_bad_eval_input_is_one_clear_line(place, args, message):
    result = grpo("eval", "--model", "model", *args, cwd=place)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_an_environment_that_raises_under_on_error_raise_is_one_line(tmp_path):
    from conftest import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "raising_env.py").write_text(
        "class Env:\n    def reset(self, row):\n        raise ValueError('no such board')\n"
        "    def step(self, messages):\n        return None, 0.0, True\n")
    result = grpo("train", "--model", "tiny", "--env", "raising_env.py:Env", "--on-error", "raise", "--steps", "1",
                  "--preflight", "off", "--eval-size", "4", "--prompts-per-step", "2", "--group-size", "2",
                  "--max-new-tokens", "4", "--device", "cpu", "--output", "run", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout, result.stderr[-2000:]
    assert len(lines) == 1 and "raised (on_error='raise'): no such board" in lines[0], lines


def test_a_checker_that_hangs_costs_grpo_eval_its_time_limit_not_the_evaluation(tmp_path):
    # the checker sleeps for ten minutes on every completion: with the time limit each scores 0 in 2 s
    from conftest import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "hang.py").write_text("import time\n\ndef score(completion, example):\n    time.sleep(600)\n"
                                      "    return 1.0\n")
    result = grpo("eval", "--model", "tiny", "--rewards", "hang.py:score", "--reward-timeout", "2", "--eval-size",
                  "3", "--samples", "0", "--max-new-tokens", "4", "--device", "cpu", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["heldout_accuracy"] == 0.0
