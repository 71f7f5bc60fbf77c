"""What the setup before the weights load sees is what the trainer will run: the formatted task, the memory
check every entry point runs, the user's files imported once, the sandbox an environment asks for."""

from __future__ import annotations

import os
import sys
import types

import pytest

from grpo.config import ConfigError, TrainConfig
from grpo.rewards import code_tests
from grpo.rewards.sandbox import needs_sandbox
from grpo.sampling.prompts import format_task, r1_zero_reward
from grpo.tasks import get_task


def test_the_r1_zero_wrapper_keeps_a_code_checkers_sandbox_mark():
    # build_scorer turns the sandbox (and --sandbox weak) on from this mark; the wrapper once dropped it
    assert needs_sandbox([code_tests])
    assert needs_sandbox([r1_zero_reward(code_tests)])
    assert not needs_sandbox([r1_zero_reward(lambda completion, example: 1.0)])


def test_the_memory_check_before_loading_sees_the_task_as_the_trainer_formats_it(monkeypatch):
    """Under r1-zero a task's tuned token limit (add: 12) is dropped and pre-flight fits one; the check
    before loading was given the unformatted task, predicting 12-token completions for a 256-token run."""
    from grpo.cli import main

    seen = {}

    def stop(config: TrainConfig, task, nproc: int, adaptable=()) -> dict:
        seen["defaults"], seen["reward"], seen["limit"] = dict(task.defaults), task.reward, config.max_new_tokens
        raise SystemExit(0)

    monkeypatch.setattr("grpo.run.memory_check.check_memory", stop)
    with pytest.raises(SystemExit):
        main(["train", "--task", "add", "--prompt-format", "r1-zero", "--steps", "1"])
    assert "max_new_tokens" not in seen["defaults"] and seen["limit"] == 256  # resolved as the trainer runs it
    assert getattr(seen["reward"], "r1_zero", False)
    formatted = format_task(get_task("add"), TrainConfig(prompt_format="plain"))
    assert formatted.defaults.get("max_new_tokens") == 12  # the plain format keeps it: the test tells them apart


TOO_BIG = dict(group_size=256, prompts_per_step=64, max_new_tokens=4096)  # docs/memory.md's refused run


def nothing_loads(*args, **kwargs):
    raise AssertionError("the trainer was built: the run that cannot fit was not refused before loading")


def test_grpo_preflight_refuses_a_run_that_cannot_fit_in_one_line(monkeypatch, capsys):
    """`grpo preflight` runs grpo train's memory check before the weights load (it once loaded them)."""
    from grpo.cli import main

    monkeypatch.setattr("grpo.run.trainer.GRPOTrainer", nothing_loads)
    code = main(["preflight", *(f"--{k.replace('_', '-')}={v}" for k, v in TOO_BIG.items())])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("grpo preflight: error: not enough memory:"), err


def test_grpo_train_in_python_refuses_a_run_that_cannot_fit_before_loading(monkeypatch, tmp_path):
    """grpo.train() runs the same check, and refuses with the ConfigError its other refusals raise."""
    import grpo

    monkeypatch.setattr("grpo.run.trainer.GRPOTrainer", nothing_loads)
    with pytest.raises(ConfigError, match=r"^not enough memory: the run needs about ") as refused:
        grpo.train(TrainConfig(**TOO_BIG), run_dir=tmp_path / "run", progress=False)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists()


COUNTED = '''
import os

with open({counter!r}, "a") as f:  # one line per import, by the process that imported it
    f.write(f"{{os.getpid()}}\\n")


def double(x: int) -> int:
    """Double a number.

    Args:
        x: the number
    """
    return 2 * x


class CodingEnv:
    """An environment that would run the model's code: it asks for the sandbox."""

    needs_sandbox = True

    def reset(self, example):
        return [{{"role": "user", "content": example["prompt"]}}]

    def step(self, messages):
        return [], 0.0, True
'''


def user_file(tmp_path, name: str) -> tuple[str, object]:
    """A user's tool and environment file that counts its imports; its path and the count's file."""
    counter = tmp_path / f"{name}.imports"
    path = tmp_path / f"{name}.py"
    path.write_text(COUNTED.format(counter=str(counter)))
    return str(path), counter


def test_a_tool_file_is_imported_once_by_the_setup_path(tmp_path, monkeypatch):
    """resolve_run imports the user's tool file to check it; the trainer's agent uses what it imported
    (the agent once imported the file again: its top-level code ran twice)."""
    from test_agent_training import agent_trainer

    path, counter = user_file(tmp_path, "counted_tools_36")
    monkeypatch.delitem(sys.modules, "counted_tools_36", raising=False)
    trainer = agent_trainer(env=None, tools_spec=f"{path}:double")
    try:
        assert list(trainer.toolbox.fns) == ["double"]
    finally:
        trainer.close()
        sys.modules.pop("counted_tools_36", None)
    assert counter.read_text().split().count(str(os.getpid())) == 1


def test_an_environment_given_by_env_that_runs_code_gets_the_sandbox(tmp_path, monkeypatch):
    """An --env environment marked needs_sandbox is checked (resolve_run) and sets the sandbox up before
    the reward workers fork (build_scorer), as a task's own environment is; both once looked at the task's
    environment alone."""
    from test_agent_training import agent_trainer

    path, _ = user_file(tmp_path, "coding_env_36")
    checked, set_up = [], []
    monkeypatch.setattr("grpo.run.build.check_sandbox", lambda mode=None: checked.append(mode) or mode)
    monkeypatch.setattr("grpo.run.build.set_sandbox", set_up.append)  # not the process's: other tests run after
    monkeypatch.delitem(sys.modules, "coding_env_36", raising=False)
    trainer = agent_trainer(env=None, env_spec=f"{path}:CodingEnv", sandbox="weak")
    try:
        assert trainer.agent is not None
    finally:
        trainer.close()
        sys.modules.pop("coding_env_36", None)
    assert checked == ["weak", "weak"] and set_up == ["weak"]


def test_the_memory_check_leaves_alone_what_a_python_config_set(monkeypatch):
    """An option given in Python is the user's, even at its default (eval_batch_size=128), and the check
    before loading may not adapt it (only micro_batch_tokens, the one not given here)."""
    from grpo.run.build import check_before_loading, resolve_run

    seen = {}

    def record(model, config, prompt_tokens, device, adaptable, *rest):
        seen["adaptable"] = set(adaptable)
        return {}, types.SimpleNamespace(host={})  # a prediction with no host terms

    monkeypatch.setattr("grpo.run.memory_check.adapt_to_memory", record)
    config = TrainConfig(gradient_checkpointing=True, eval_batch_size=128)
    check_before_loading(resolve_run(config, processes=1), 1)
    assert seen["adaptable"] == {"micro_batch_tokens"}


def test_train_after_stepping_by_hand_keeps_the_config_the_steps_ran_with(tmp_path, capsys):
    """step() before train() settles the config as given; train()'s pre-flight then fits a limit that it
    must not adopt (the steps already ran at the given one): it says so and the run goes on."""
    from tiny_run import tiny_trainer

    trainer = tiny_trainer(steps=2, preflight="warn", max_new_tokens=0, preflight_prompts=2, max_gen_rounds=1,
                           stop=("a",), eval_size=4)
    try:
        trainer.step(1)
        given = trainer.config
        trainer.train(tmp_path / "run")
        assert trainer.config is given and given.max_new_tokens == 256
    finally:
        trainer.close()
    assert "not adopted: steps already ran with the config as given" in capsys.readouterr().out
