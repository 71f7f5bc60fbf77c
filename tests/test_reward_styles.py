"""Rewards written for TRL and verl, loaded by ``file.py:function`` and called as those trainers call them."""

from pathlib import Path

import pytest

from grpo.rewards import RewardError, combine_rewards, resolve_reward
from grpo.rewards.styles import check_style, detect_style

FOREIGN = Path(__file__).parent / "fixtures" / "foreign"
TRL, VERL = FOREIGN / "trl_rewards.py", FOREIGN / "verl_gsm8k.py"


def trl(name: str):
    return resolve_reward(f"{TRL}:{name}")


def verl(name: str):
    return resolve_reward(f"{VERL}:{name}")


CHAT_ROWS = [  # TRL's conversational format: the prompt is a list of messages
    {"prompt": [{"role": "user", "content": "1/2 + 1/4?"}], "solution": "$\\frac{3}{4}$"},
    {"prompt": [{"role": "user", "content": "2 + 2?"}], "solution": "no maths here"},
]


def test_styles_are_read_from_the_signatures():
    for name in ("reward_len", "format_reward_func", "accuracy_reward", "async_len"):
        assert detect_style(trl(name)) == "trl"
    assert detect_style(verl("compute_score")) == "verl"
    assert detect_style(verl("gsm8k_only")) == "verl"
    assert detect_style(resolve_reward("math_answer")) == "grpo"
    assert detect_style(lambda completion, example: 1.0) == "grpo"


def test_a_function_of_no_accepted_form_is_refused_with_the_three_forms():
    def three(a, b, c):
        return 0.0

    with pytest.raises(RewardError) as err:
        detect_style(three)
    message = str(err.value)
    assert "\n" not in message
    for form in ("fn(completion, example)", "fn(completions, **kwargs)", "compute_score(data_source, solution_str"):
        assert form in message


def test_a_stated_style_must_fit_the_signature():
    assert check_style(trl("reward_len"), "trl") == "trl"
    assert check_style(trl("accuracy_reward"), "trl") == "trl"  # `solution` is a column, known when called
    assert check_style(verl("compute_score"), "verl") == "verl"
    assert check_style(verl("gsm8k_only"), "verl") == "verl"
    assert check_style(resolve_reward("math_answer"), "grpo") == "grpo"
    with pytest.raises(RewardError, match="does not fit the verl style"):
        check_style(trl("reward_len"), "verl")
    with pytest.raises(RewardError, match="does not fit the trl style"):
        check_style(verl("compute_score"), "trl")


@pytest.mark.parametrize("workers", [0, 2])
def test_trl_quick_start_length_reward(workers):
    texts = ["x" * 20, "x" * 5, "x" * 26]
    rows = [{"prompt": "Summarize: ..."}] * 3
    score = combine_rewards([trl("reward_len")], workers=workers)
    try:
        total, metrics = score(texts, rows)
    finally:
        score.close()
    assert total.tolist() == [0.0, -15.0, -6.0]  # -|20 - len|
    assert metrics["reward/reward_len"] == pytest.approx(-7.0)
    assert metrics["reward_none/reward_len"] == 0.0


@pytest.mark.parametrize("workers", [0, 2])
def test_trl_conversational_rewards_see_messages_and_columns(workers):
    texts = ["<think>add</think><answer>$\\frac{3}{4}$</answer>", "4"]
    fns = [trl("format_reward_func"), trl("accuracy_reward")]
    score = combine_rewards(fns, [1.0, 2.0], workers=workers)
    try:
        total, metrics = score(texts, CHAT_ROWS)
    finally:
        score.close()
    # format: [1, 0]; accuracy: [1, None] (the second solution does not parse: no reward, as in TRL)
    assert total.tolist() == [3.0, 0.0]
    assert metrics["reward/format_reward_func"] == 0.5
    assert metrics["reward/accuracy_reward"] == 1.0  # the mean leaves the None out
    assert metrics["reward_none/accuracy_reward"] == 1.0
    assert metrics["reward_errors/accuracy_reward"] == 0.0


def test_trl_keyword_lists_hold_completion_ids_and_every_column():
    score = combine_rewards([trl("seen_columns")])
    total, _ = score(["ab", "c"], [{"prompt": "p", "topic": "t"}] * 2, completion_ids=[[5, 6], [7]])
    assert total.tolist() == [102.0, 101.0]


def test_async_trl_rewards_are_awaited():
    total, _ = combine_rewards([trl("async_len")])(["abc", ""], [{"prompt": "p"}] * 2)
    assert total.tolist() == [3.0, 0.0]


def test_a_trl_reward_of_the_wrong_length_is_an_error_on_every_sample():
    def short(completions, **kwargs):
        return [1.0]

    with pytest.warns(RuntimeWarning, match="must return a list of 2 values, got 1 values"):
        total, metrics = combine_rewards([short])(["a", "b"], [{"prompt": "p"}] * 2)
    assert total.isnan().all()  # every row errored: no verdict (training leaves them out)
    assert metrics["reward_errors/short"] == 2.0


@pytest.mark.parametrize("workers", [0, 2])
def test_verl_gsm8k_compute_score(workers):
    rows = [{"prompt": "q", "answer": "18", "data_source": "openai/gsm8k"},
            {"prompt": "q", "reward_model": {"ground_truth": "7", "style": "rule"}},  # verl's parquet layout
            {"prompt": "q", "answer": "3"}]
    texts = ["so #### 18", "#### 7", "three"]
    fns = [verl("compute_score"), verl("compute_score_dict"), verl("gsm8k_only")]
    score = combine_rewards(fns, workers=workers)
    try:
        total, metrics = score(texts, rows)
    finally:
        score.close()
    assert total.tolist() == [3.0, 3.0, 0.0]
    assert metrics["reward/compute_score_dict"] == pytest.approx(2 / 3)
    assert metrics["reward/compute_score_dict/acc"] == pytest.approx(2 / 3)  # the dict's other numbers
    assert "reward/compute_score_dict/pred" not in metrics  # a string is not a metric


def test_grpo_rewards_may_not_return_none():
    with pytest.warns(RuntimeWarning, match="only trl-style rewards may skip"):
        total, _ = combine_rewards([lambda completion, example: None])(["a"], [{"prompt": "p"}])
    assert total.isnan().all()  # an error: the row errored
