"""Dataset loading, the Countdown and code tasks, and `grpo check-reward`."""

import json
from pathlib import Path

import pytest

from grpo.cli import main
from grpo.tasks import DataError, Task, get_task, load_rows, load_task
from grpo.tasks.countdown import countdown_reward, evaluate

FIXTURES = Path(__file__).parent / "fixtures"
GSM8K = str(FIXTURES / "gsm8k_small.jsonl")


def test_gsm8k_format_is_recognised():
    rows = load_rows(GSM8K)
    assert rows[0]["prompt"].startswith("Janet") and rows[0]["answer"] == "18"
    assert rows[2]["answer"] == "70000"  # thousands separator removed
    assert rows[0]["solution"].endswith("#### 18")


def test_csv_parquet_and_hf_folder_with_field_mapping(tmp_path):
    rows = load_rows(str(FIXTURES / "small.csv"), prompt_field="q", answer_field="a",
                     prompt_template="Solve: {prompt}")
    assert rows[1] == {"q": "What is 2+3?", "a": "5", "prompt": "Solve: What is 2+3?", "answer": "5"}
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"problem": "p1", "target": "1"}]), tmp_path / "d.parquet")
    assert load_rows(str(tmp_path / "d.parquet"))[0]["answer"] == "1"
    datasets.Dataset.from_list([{"question": "q", "answer": "x\n#### 4"}]).save_to_disk(str(tmp_path / "hf"))
    assert load_rows(str(tmp_path / "hf"))[0]["answer"] == "4"


@pytest.mark.parametrize("name, message", [
    ("bad_json.jsonl", r"bad_json.jsonl:2: invalid JSON"),
    ("missing_field.jsonl", r"missing_field.jsonl:2: no answer field"),
    ("empty_prompt.jsonl", r"empty_prompt.jsonl:2: field 'prompt' is empty"),
])
def test_malformed_rows_name_file_line_and_field(name, message):
    with pytest.raises(DataError, match=message):
        load_rows(str(FIXTURES / name))


def test_bad_data_on_the_cli_is_one_line_and_exit_2(capsys):
    assert main(["train", "--data", str(FIXTURES / "bad_json.jsonl"), "--output", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad_json.jsonl:2: invalid JSON" in err
    assert main(["train", "--data", GSM8K, "--answer-field", "nope"]) == 2
    assert "missing field 'nope'" in capsys.readouterr().err


def test_dataset_task_split_is_disjoint_and_seeded():
    a = load_task("", data=GSM8K, heldout_size=2, system_prompt="Be brief.")
    b = load_task("", data=GSM8K, heldout_size=2)
    assert len(a.heldout) == 2 and len(a.train) == 4
    assert [r["prompt"] for r in a.heldout] == [r["prompt"] for r in b.heldout]
    assert not {r["prompt"] for r in a.train} & {r["prompt"] for r in a.heldout}
    assert a.messages(a.train[0])[0] == {"role": "system", "content": "Be brief."}


def test_countdown_checks_the_expression_safely():
    row = {"numbers": [3, 7, 25], "target": 46}
    assert countdown_reward("<think>..</think><answer>(25 - 7) * 3 - 8 + 0</answer>", row) == 0.0  # extra numbers
    assert countdown_reward("<answer>25 + 7 * 3</answer>", row) == 1.0
    assert countdown_reward("<answer>25 + 7 * 3 = 46</answer>", row) == 1.0
    assert countdown_reward("<answer>25 + 21</answer>", row) == 0.0  # not the given numbers
    assert countdown_reward("<answer>__import__('os').system('x')</answer>", row) == 0.0
    assert countdown_reward("<answer>3 / (7 - 7) + 25</answer>", row) == 0.0
    assert evaluate("7 / 2")[0] == pytest.approx(3.5)
    assert evaluate("2 ** 3") is None  # only + - * /


def test_countdown_and_code_tasks_have_disjoint_seeded_splits():
    for name in ("countdown", "code"):
        a, b = get_task(name, heldout_size=32), get_task(name, heldout_size=32)
        assert [r["prompt"] for r in a.heldout] == [r["prompt"] for r in b.heldout]
        assert not {r["prompt"] for r in a.train} & {r["prompt"] for r in a.heldout}
    row = get_task("countdown").heldout[0]
    assert countdown_reward(f"<answer>{'+'.join(map(str, row['numbers']))}</answer>", row) in (0.0, 1.0)


def test_check_reward_passes_math_answer_and_fails_a_naive_reward(tmp_path, capsys):
    assert main(["check-reward", "--rewards", "math_answer", "--data", GSM8K, "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "exploit probes passing: 0" in out and "100.00%" in out
    naive = tmp_path / "naive.py"
    naive.write_text("def contains(completion, example):\n    return float(example['answer'] in completion)\n")
    assert main(["check-reward", "--rewards", f"{naive}:contains", "--data", GSM8K, "--workers", "0"]) == 1
    out = capsys.readouterr().out
    assert "every integer 0..1000" in out and "FAIL" in out


REWARDS = """
from grpo.rewards.math import math_answer


def templated(completion, example):  # full marks only on the prompt as training renders it
    return math_answer(completion, example) if example["prompt"].startswith("Q: ") else 0.0


def any_call(*args, **kwargs):  # a signature that fits grpo's and verl's styles: auto reads it as grpo's
    if "solution_str" not in kwargs:
        raise TypeError("not called as verl calls a reward")
    return math_answer(kwargs["solution_str"], {"answer": kwargs["ground_truth"]})
"""


def test_check_reward_takes_the_reward_options_grpo_train_takes(tmp_path, capsys):
    """--rewards, --reward-style, --prompt-template and --system-prompt as grpo train takes them: the reward is
    called in the stated style, on rows with the template applied (issue 52); --reward still works, with a note."""
    code = tmp_path / "rewards.py"
    code.write_text(REWARDS)
    base = ["check-reward", "--data", GSM8K, "--workers", "0", "--limit", "4"]
    assert main([*base, "--rewards", f"{code}:templated", "--prompt-template", "Q: {prompt}",
                 "--system-prompt", "Think step by step."]) == 0
    assert main([*base, "--rewards", f"{code}:templated"]) == 1  # the rows as they are: the gold forms score 0
    capsys.readouterr()
    # verl passes no truncation flag, so the cut-off probe scores under any verl reward: compare the gold forms
    main([*base, "--rewards", f"{code}:any_call", "--reward-style", "verl"])
    assert "gold forms scoring the maximum: 17/17" in capsys.readouterr().out
    assert main([*base, "--rewards", f"{code}:any_call"]) == 1  # auto calls it as grpo's: every call errs
    assert "gold forms scoring the maximum: 0/17" in capsys.readouterr().out
    assert main([*base, "--rewards", "math_answer", "--reward-style", "trl"]) == 2  # refused, as grpo train does
    assert "does not fit the trl style" in capsys.readouterr().err
    assert main([*base, "--reward", "math_answer"]) == 0
    assert "--reward is deprecated: --rewards" in capsys.readouterr().err
    assert main([*base]) == 0  # no --rewards: the data's own reward, math_answer, as grpo train's
    assert "math_answer" in capsys.readouterr().out


def test_arith_mix_spans_one_to_three_digits_with_correct_answers():
    task, again = get_task("arith-mix"), get_task("arith-mix")
    assert task.heldout == again.heldout and len(task.heldout) == 256
    rows = [*task.train, *task.heldout]
    assert len({r["prompt"] for r in rows}) == len(rows) == 915  # no problem in both splits
    for row in rows:
        a, op, b = row["prompt"].removeprefix("What is ").split("?")[0].split()
        assert int(row["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert int(row["answer"]) >= 0 and row["prompt"].endswith("Reply with only the number.")
    digits = {(len(r["prompt"].split()[2]), len(r["prompt"].split()[4].rstrip("?"))) for r in rows}
    assert (1, 1) in digits and (3, 3) in digits and len(digits) == 9
    assert task.reward("7 + 2 = 9", {"answer": "9"}) == 1.0 and task.reward("9 or 10", {"answer": "9"}) == 0.0


def test_conversational_prompts_stay_messages(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4"}) + "\n")
    (row,) = load_rows(str(path), prompt_template="ignored {prompt}")
    assert row["prompt"] == [{"role": "user", "content": "2+2?"}] and row["answer"] == "4"
    task = Task("chat", [row], [row], lambda c, r: 0.0, "Be brief.")
    assert task.messages(row) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def test_answers_are_optional_only_when_the_rewards_do_not_need_them(tmp_path):
    path = tmp_path / "tldr.jsonl"
    path.write_text(json.dumps({"prompt": "Summarize this."}) + "\n")
    with pytest.raises(DataError, match="no answer field"):
        load_rows(str(path))
    (row,) = load_rows(str(path), require_answer=False)
    assert "answer" not in row


def test_verl_rows_take_their_ground_truth_as_the_answer(tmp_path):
    path = tmp_path / "verl.jsonl"
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "q"}],
           "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"index": 0}}
    path.write_text(json.dumps(row) + "\n")
    assert load_rows(str(path))[0]["answer"] == "72"


def test_eval_data_is_the_held_out_set_and_training_keeps_every_row(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(6)))
    test.write_text("".join(json.dumps({"question": f"t{i}", "answer": str(i)}) + "\n" for i in range(4)))
    task = load_task("", data=str(train), eval_data=str(test), heldout_size=3)
    assert [r["prompt"] for r in task.train] == [f"q{i}" for i in range(6)]
    assert [r["prompt"] for r in task.heldout] == ["t0", "t1", "t2"]


def test_alpaca_rows_take_instruction_and_input_as_the_prompt(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    path.write_text('{"instruction": "Sam has 19 marbles and buys 7 more. How many now?", "input": "", "output": "26"}\n'
                    '{"instruction": "Add the numbers.", "input": "12 and 30", "output": "42"}\n')
    rows = load_rows(str(path))
    assert [r["prompt"] for r in rows] == ["Sam has 19 marbles and buys 7 more. How many now?",
                                           "Add the numbers.\n\n12 and 30"]
    assert [r["answer"] for r in rows] == ["26", "42"]
