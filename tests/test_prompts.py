"""Prompt formats (grpo/sampling/prompts.py): chat, plain, r1-zero, auto; few-shot examples; their stop strings
and reward; a model whose tokenizer has no chat template, through train, eval and preflight."""

from __future__ import annotations

import json

import pytest
from conftest import make_model, make_tokenizer

from grpo.config import ConfigError, TrainConfig
from grpo.rewards import final_number
from grpo.sampling.prompts import (
    PromptFormat,
    encode_prompts,
    format_task,
    loaded_format,
    plain_text,
    prompt_format,
    r1_zero_reward,
    r1_zero_text,
)
from grpo.tasks import Task

ASK = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 2 + 3?"}]


def bare_tokenizer():
    """The tests' character tokenizer with its chat template removed: a base model's."""
    tokenizer = make_tokenizer()
    tokenizer.chat_template = None
    return tokenizer


def test_plain_renders_system_prompt_question_and_answer_cue():
    assert plain_text(ASK) == "Be exact.\n\nQuestion: What is 2 + 3?\nAnswer:"
    shots = [ASK[0], {"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}, ASK[1]]
    assert plain_text(shots) == "Be exact.\n\nQuestion: 1 + 1?\nAnswer: 2\n\nQuestion: What is 2 + 3?\nAnswer:"
    assert PromptFormat("plain").stops(("###",)) == ("###", "\n", "Question:")


def test_r1_zero_renders_the_template_ending_inside_think():
    text = r1_zero_text(ASK)
    assert text.startswith("A conversation between User and Assistant.")
    assert text.endswith("<think> reasoning process here </think> <answer> answer here </answer>.\n"
                         "Be exact.\nUser: What is 2 + 3?\nAssistant: <think>")
    assert PromptFormat("r1-zero").stop == ("</answer>",)


def test_r1_zero_reward_is_the_checker_or_the_format_score():
    reward = r1_zero_reward(final_number)
    row = {"prompt": "What is 2 + 3?", "answer": "5"}
    # the completion continues after the cue's "<think>"
    assert reward(" 2 plus 3 is 5 </think> <answer>5</answer>", row) == 1.0
    assert reward(" 2 plus 3 is 6 </think> <answer>6</answer>", row) == 0.1  # right layout, wrong answer
    assert reward(" 2 plus 3 </think> 6", row) == 0.0
    assert reward("<think> again </think> <answer>6</answer>", row) == 0.0  # a second <think>: not the layout


def test_auto_is_the_chat_template_else_plain():
    assert prompt_format(make_tokenizer()).name == "chat"
    assert prompt_format(bare_tokenizer()).name == "plain"
    with pytest.raises(ConfigError, match="has no chat template; use --prompt-format plain or r1-zero"):
        prompt_format(bare_tokenizer(), "chat")


def test_a_users_chat_template_file_renders_the_prompts(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    fmt = prompt_format(bare_tokenizer(), "auto", str(path))
    tokenizer = bare_tokenizer()
    assert tokenizer.decode(fmt.encode(tokenizer, ASK)) == "[Be exact.][What is 2 + 3?]>"
    with pytest.raises(ConfigError, match="cannot read chat_template"):
        prompt_format(tokenizer, "auto", str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match="chat_template is a chat format's template"):
        TrainConfig(prompt_format="plain", chat_template=str(path))


def test_encode_prompts_without_a_format_never_needs_a_template():
    tokenizer = bare_tokenizer()
    (ids,) = encode_prompts(tokenizer, [ASK])
    assert tokenizer.decode(ids) == "Be exact.\n\nQuestion: What is 2 + 3?\nAnswer:"


def test_a_format_no_file_told_is_settled_from_the_loaded_tokenizer_with_its_stops():
    fmt, config, sources = loaded_format(TrainConfig(stop=("!",)), {"stop": "python"}, bare_tokenizer())
    assert fmt.name == config.prompt_format == "plain" and sources["prompt_format"] == "tokenizer"
    assert config.stop == ("!", "\n", "Question:") and sources["stop"] == "python"  # the user's strings stand
    _, again, same = loaded_format(config, sources, bare_tokenizer())  # a resumed run's settled config: unchanged
    assert (again, same) == (config, sources)


def test_few_shot_examples_come_from_training_rows_that_are_then_left_out():
    rows = [{"prompt": f"{i} + 1?", "answer": str(i + 1)} for i in range(10)]
    task = format_task(Task("t", rows, rows[:2], final_number), TrainConfig(few_shot=2))
    assert len(task.examples) == 2 and len(task.train) == 8
    assert not any(ex in task.train for ex in task.examples)
    msgs = task.messages({"prompt": "9 + 9?"})
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == task.examples[0]["answer"]
    assert format_task(Task("t", rows, rows[:2], final_number), TrainConfig(few_shot=2)).examples == task.examples
    with pytest.raises(ConfigError, match="r1-zero's template is zero-shot"):
        TrainConfig(few_shot=2, prompt_format="r1-zero")


def test_r1_zero_wraps_the_tasks_checker_once():
    task = Task("t", [{"prompt": "q", "answer": "1"}] * 3, [], final_number)
    once = format_task(task, TrainConfig(prompt_format="r1-zero"))
    assert once.reward.__name__ == "final_number_r1_zero"
    assert format_task(once, TrainConfig(prompt_format="r1-zero")).reward is once.reward


def test_episodes_refuse_a_text_format_in_one_line():
    from grpo.sampling.episodes import make_agent
    from grpo.tasks import get_task

    task = get_task("calc", heldout_size=4)
    with pytest.raises(ConfigError, match="prompt format plain writes one question and one answer; episodes"):
        make_agent(TrainConfig(task="calc", max_turns=2, max_episode_tokens=64), task, bare_tokenizer())


@pytest.fixture
def bare_model_dir(tmp_path):
    """A model folder whose tokenizer has no chat template."""
    tokenizer = bare_tokenizer()
    folder = tmp_path / "bare"
    make_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert not (folder / "chat_template.jinja").exists()
    return folder


def test_a_model_without_chat_template_runs_train_eval_and_preflight(bare_model_dir, tmp_path, capsys):
    from grpo.cli import main

    small = ["--model", str(bare_model_dir), "--task", "add", "--eval-size", "4"]
    run = tmp_path / "run"
    assert main(["train", *small, "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                 "--max-new-tokens", "4", "--preflight", "warn", "--preflight-prompts", "2", "--max-gen-rounds", "1",
                 "--output", str(run), "--no-progress", "--reward-workers", "0", "--device", "cpu"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    assert main(["eval", *small, "--samples", "0", "--device", "cpu"]) == 0
    assert main(["preflight", *small, "--max-new-tokens", "4", "--preflight-prompts", "2", "--group-size", "2",
                 "--max-gen-rounds", "1", "--reward-workers", "0", "--device", "cpu", "--preflight", "warn"]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err


def test_the_trainer_renders_and_stops_in_the_configured_format(capsys):
    from tiny_run import tiny_config, tiny_task

    from grpo.run.build import resolve_run
    from grpo.run.preflight import run_preflight
    from grpo.run.trainer import GRPOTrainer

    tokenizer = bare_tokenizer()
    config = tiny_config(prompt_format="r1-zero", preflight="warn", preflight_prompts=2, max_gen_rounds=1)
    model = make_model(len(tokenizer))
    trainer = GRPOTrainer(resolve_run(config, task=tiny_task(final_number), model=model), model=model,
                          tokenizer=tokenizer, progress=False)
    try:
        assert trainer.config.stop == ("</answer>",)
        assert tokenizer.decode(trainer.train_prompts[0]).endswith("User: say a 0\nAssistant: <think>")
        assert trainer.task.reward.__name__ == "final_number_r1_zero"
        report = run_preflight(trainer.sampling, trainer.learner, fit=False)
    finally:
        trainer.close()
    assert "prompt format r1-zero; stop strings '</answer>'" in report.describe()
    assert "prompt format r1-zero, stop strings '</answer>'" in capsys.readouterr().out


def test_r1_zero_drops_the_tasks_tuned_token_limit():
    # add's 12 tokens hold "23 + 45 = 68", not <think> ... </think><answer> 68 </answer>: measured on the
    # embedded model, 97% of r1-zero completions were cut at 12 and no step had a reward to learn from
    from grpo.config import DATA_MAX_NEW_TOKENS, TrainConfig
    from grpo.config_resolution import settle_config
    from grpo.sampling.prompts import format_task
    from grpo.tasks import get_task

    task = get_task("add", heldout_size=8)
    assert task.defaults["max_new_tokens"] == 12
    zero = format_task(task, TrainConfig(prompt_format="r1-zero"))
    assert "max_new_tokens" not in zero.defaults and zero.defaults.get("steps") == task.defaults.get("steps")
    assert settle_config(TrainConfig(prompt_format="r1-zero"), zero).max_new_tokens == DATA_MAX_NEW_TOKENS
    assert format_task(task, TrainConfig(prompt_format="plain")).defaults["max_new_tokens"] == 12
