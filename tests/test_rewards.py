"""Built-in rewards on hand-written completions, and the weighted, worker-pool scorer."""

import math

import pytest
import torch

from grpo.rewards import (
    RewardCallError,
    RewardError,
    answer_only,
    combine_rewards,
    exact_match,
    final_number,
    math_answer,
    multiple_choice,
    overlong_penalty,
    regex_match,
    resolve_reward,
    soft_overlong_penalty,
    think_format,
)
from grpo.rewards.combine import pool_score_metrics, pooled_std

ROW = {"prompt": "How many eggs?", "answer": "18"}


@pytest.mark.parametrize("completion", [
    "9 * 2 = 18",
    "She makes \\boxed{18} dollars.",
    "#### 18",
    "The answer is 18.",
    "The answer is $18.00. She earned 2 per egg.",
    "<answer>18</answer>",
    "\\boxed{\\frac{36}{2}}",
    "Final answer: 18 dollars",
    "\\boxed{18} ... so again \\boxed{18}",
])
def test_math_answer_accepts_the_gold_answer_in_many_forms(completion):
    assert math_answer(completion, ROW) == 1.0


@pytest.mark.parametrize("completion", [
    "",
    "The answer is 17.",
    "\\boxed{18} or \\boxed{19}",
    "The answer is 18 or 19.",
    "5 or 6",
    "0, 1, 2, 3, 18, 19",
    "x " * 20_000 + "The answer is 18.",
    "How many eggs?",
])
def test_math_answer_rejects_wrong_and_hedged_answers(completion):
    assert math_answer(completion, ROW) == 0.0


def test_math_answer_handles_thousands_fractions_and_percent():
    assert math_answer("The answer is 70,000.", {"answer": "70000"}) == 1.0
    assert math_answer("\\boxed{\\frac{1}{2}}", {"answer": "0.5"}) == 1.0
    assert math_answer("\\boxed{-7}", {"answer": "-7"}) == 1.0


def test_format_and_choice_rewards():
    assert think_format("<think>a</think>\n<answer>1</answer>", ROW) == 1.0
    assert think_format("<think>a</think><answer>1</answer><answer>2</answer>", ROW) == 0.0
    assert think_format("<answer>1</answer>", ROW) == 0.0
    assert think_format("<think> </think><answer>1</answer>", ROW) == 0.0
    assert multiple_choice("The answer is (B).", {"answer": "B"}) == 1.0
    assert multiple_choice("\\boxed{C}", {"answer": "B"}) == 0.0
    assert multiple_choice("The answer is A. No, the answer is B", {"answer": "B"}) == 0.0
    assert regex_match(" 2024-01-05 ", {"pattern": r"\d{4}-\d\d-\d\d"}) == 1.0
    assert regex_match("on 2024-01-05", {"pattern": r"\d{4}-\d\d-\d\d"}) == 0.0
    assert exact_match(" 18\n", ROW) == 1.0


def test_soft_overlong_penalty_by_hand():
    # L_max = 100, L_cache = 20: free up to 80, then (80 - |y|) / 20, -1 past 100
    assert soft_overlong_penalty(80, 100, 20) == 0.0
    assert soft_overlong_penalty(90, 100, 20) == -0.5
    assert soft_overlong_penalty(100, 100, 20) == -1.0
    assert soft_overlong_penalty(101, 100, 20) == -1.0
    assert overlong_penalty("x", {"completion_tokens": 90, "max_completion_tokens": 100}) == -0.5


def boom(completion, example):
    raise ZeroDivisionError("boom")


def slow(completion, example):
    import time

    time.sleep(30)
    return 1.0


def nan_reward(completion, example):
    return float("nan")


def test_weighted_combination_logs_each_raw_mean():
    score = combine_rewards([math_answer, think_format], [1.0, 0.5])
    texts = ["<think>x</think><answer>18</answer>", "The answer is 18", "no"]
    total, metrics = score(texts, [ROW] * 3)
    assert total.tolist() == [1.5, 1.0, 0.0]
    assert metrics["reward/math_answer"] == pytest.approx(2 / 3)
    assert metrics["reward/think_format"] == pytest.approx(1 / 3)


def test_worker_pool_matches_in_process_and_passes_lengths():
    texts = ["The answer is 18", "17", "\\boxed{18}", "x"] * 3
    rows = [ROW] * len(texts)
    lengths = [10, 90, 100, 50] * 3
    inline = combine_rewards([math_answer, overlong_penalty], max_completion_tokens=100)
    pooled = combine_rewards([math_answer, overlong_penalty], workers=2, max_completion_tokens=100)
    try:
        a, b = inline(texts, rows, lengths), pooled(texts, rows, lengths)
    finally:
        pooled.close()
    assert a[0].tolist() == b[0].tolist()
    assert a[0].tolist()[:4] == [1.0, -0.5, 0.0, 0.0]


def test_the_token_limit_is_the_calls_not_one_set_on_the_scorer():
    # a run's pre-flight check may fit a new limit: each call says the limit its completions were sampled under
    texts, rows, lengths = ["17", "17"], [ROW, ROW], [90, 45]
    score = combine_rewards([overlong_penalty])
    assert score(texts, rows, lengths, max_completion_tokens=100)[0].tolist() == [-0.5, 0.0]
    assert score(texts, rows, lengths, max_completion_tokens=50)[0].tolist() == [-1.0, -0.5]
    assert score.max_completion_tokens is None


def test_errors_and_timeouts_mark_the_row_errored_are_counted_and_warned():
    score = combine_rewards([boom, slow, nan_reward, exact_match], workers=2, timeout=0.5)
    try:
        with pytest.warns(RuntimeWarning, match="ZeroDivisionError: boom"):
            total, metrics = score(["18", "18"], [ROW, ROW])
        assert score.checker_scores(["18"], [ROW]) == [0.0]  # as a checker (evaluation), a failure scores 0
    finally:
        score.close()
    assert total.isnan().all()  # the row errored: no verdict, whatever exact_match said (training leaves it out)
    assert metrics["reward_errors/boom"] == 2 and metrics["reward_timeouts/boom"] == 0
    assert metrics["reward_errors/slow"] == 2 and metrics["reward_timeouts/slow"] == 2
    assert metrics["reward_errors/nan_reward"] == 2
    assert metrics["reward_errors/exact_match"] == 0


def test_only_the_rows_whose_call_failed_are_errored():
    def picky(completion: str, example: dict) -> float:
        if completion == "x":
            raise ValueError("cannot read x")
        return 1.0

    with pytest.warns(RuntimeWarning, match="1 of 3 calls failed: their rows errored"):
        total, metrics = combine_rewards([picky, exact_match])(["18", "x", "17"], [ROW, ROW, ROW])
    assert total[0].item() == 2.0 and total[1].isnan() and total[2].item() == 1.0
    assert metrics["reward_errors/picky"] == 1


def test_a_failed_call_is_left_out_of_its_reward_mean_as_its_row_is_of_reward_mean():
    def half(completion: str, example: dict) -> float:
        if completion == "x":
            raise ValueError("cannot read x")
        return 0.5 if completion == "17" else 1.0

    with pytest.warns(RuntimeWarning, match="1 of 4 calls failed"):
        total, metrics = combine_rewards([half])(["18", "x", "17", "18"], [ROW] * 4)
    # verdicts 1.0, 0.5, 1.0 (the "x" call failed): mean 2.5 / 3, not 2.5 / 4 with the failure as 0
    assert metrics["reward/half"] == pytest.approx(2.5 / 3)
    assert metrics["reward/half"] == pytest.approx(total[~total.isnan()].mean().item())  # reward_mean's rows
    assert metrics["reward/half_std"] == pytest.approx(torch.tensor([1.0, 0.5, 1.0]).std().item())


def test_a_reward_std_pooled_over_parts_is_the_std_of_all_their_verdicts():
    def half(completion: str, example: dict) -> float:
        if completion == "x":
            raise ValueError("cannot read x")
        return {"18": 1.0, "17": 0.5}.get(completion, 0.0)

    texts = ["18", "17", "x", "x", "18", "0", "17", "x"]  # verdicts 1, .5 | none | 1, 0, .5
    with pytest.warns(RuntimeWarning):
        whole = combine_rewards([half])(texts, [ROW] * 8)[1]
        parts = [(2, combine_rewards([half])(texts[i : i + 2], [ROW] * 2)[1]) for i in (0, 2)]
        parts.append((4, combine_rewards([half])(texts[4:], [ROW] * 4)[1]))
    pooled = pool_score_metrics(parts)
    # by hand: verdicts 1, .5, 1, 0, .5, mean .6, squares .16+.01+.16+.36+.01 = .7, / 4: std sqrt(.175)
    assert pooled["reward/half_std"] == pytest.approx(math.sqrt(0.175)) == whole["reward/half_std"]
    assert pooled["reward/half"] == pytest.approx(0.6) and pooled["reward_errors/half"] == 3
    one = pool_score_metrics([(8, whole)])  # the same rows as one batch (one process, one round)
    assert (one["reward/half_std"], one["reward/half"]) == (pooled["reward/half_std"], pooled["reward/half"])
    # a part without a verdict adds nothing
    assert pool_score_metrics(parts[:2])["reward/half_std"] == pool_score_metrics(parts[:1])["reward/half_std"]
    assert pooled_std([(2, 0.75, 0.5), (0, 0.0, 0.0)]) == 0.5 and pooled_std([(1, 1.0, 0.0)] * 2) == 0.0


def test_on_error_raise_stops_with_one_line():
    score = combine_rewards([boom], on_error="raise")
    with pytest.raises(RewardCallError, match="reward boom failed on 1 of 1 .*ZeroDivisionError: boom"):
        score(["x"], [ROW])


def test_resolve_reward_from_a_file_and_errors(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def shout(completion, example):\n    return float(completion.isupper())\n")
    assert resolve_reward(f"{path}:shout")("HI", {}) == 1.0
    assert resolve_reward("think_format") is think_format
    with pytest.raises(RewardError, match="unknown reward 'combine_rewards'"):
        resolve_reward("combine_rewards")
    with pytest.raises(RewardError, match="has no config.json"):
        resolve_reward(str(tmp_path))


def test_learned_reward_model_folder_scores_prompt_and_completion(tmp_path):
    from conftest import make_tokenizer
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    rm = resolve_reward(str(tmp_path / "rm"))
    score = combine_rewards([rm, exact_match], workers=2)  # the model runs batched in this process
    try:
        total, metrics = score(["18", "abc"], [ROW, ROW])
    finally:
        score.close()
    single = rm("abc", ROW)
    assert "reward/rm_rm" in metrics
    assert total[1].item() == pytest.approx(single, abs=1e-4)


SUB = {"prompt": "What is 76 - 38? Reply with only the number.", "answer": "38"}
ADD = {"prompt": "What is 31 + 2? Reply with only the number.", "answer": "33"}


@pytest.mark.parametrize("reward", [math_answer, final_number, answer_only, exact_match])
def test_answer_rewards_give_a_cut_off_completion_nothing(reward):
    # "31 + 2 = 33" is right when the model stopped, no answer when the token limit cut it
    complete = "33" if reward in (answer_only, exact_match) else "31 + 2 = 33"
    assert reward(complete, ADD) == 1.0
    assert reward(complete, {**ADD, "truncated": True}) == 0.0
    assert reward(complete, {**ADD, "truncated": False}) == 1.0


@pytest.mark.parametrize("reward", [math_answer, final_number])
@pytest.mark.parametrize("completion", ["76 - 38 equals", "76 - 38", "So 76-38 is", "First 76, then take away 38"])
def test_an_echo_of_the_prompts_numbers_is_not_an_answer(reward, completion):
    # 76 - 38 = 38: a last-number checker would pay the echoed operand
    assert reward(completion, SUB) == 0.0


@pytest.mark.parametrize("reward", [math_answer, final_number])
@pytest.mark.parametrize("completion", ["38", "38.", "76 - 38 = 38", "76 - 38 equals 38.", "The answer is 38."])
def test_a_marked_answer_counts_even_when_it_equals_an_operand(reward, completion):
    assert reward(completion, SUB) == 1.0


def test_a_marked_answer_wins_over_numbers_in_passing():
    row = {"prompt": "How many eggs?", "answer": "18"}
    assert math_answer("The answer is 18. Check: 9 * 2 = 18, and 3 more is 21", row) == 1.0
    assert math_answer("\\boxed{18} since 20 - 2", row) == 1.0
    assert math_answer("#### 17\nor 18", row) == 0.0


@pytest.mark.parametrize("reward", [math_answer, final_number])
@pytest.mark.parametrize("completion", [
    "Step 1: 76 - 38",  # a stray number does not turn an echoed operand into an answer
    "Step 1: 76 - 38 equals",
    "76 - 038", "76.0 - 38",  # operands compared as values, not strings
    "\u0667\u0666 - \u0663\u0668",  # Arabic-Indic digits are no number
    "69 or 38", "Either 37 or 38", "x = 37 or x = 38",  # hedges on the final line
])
def test_echo_and_hedge_variants_score_nothing(reward, completion):
    assert reward(completion, SUB) == 0.0


@pytest.mark.parametrize("reward", [math_answer, final_number])
@pytest.mark.parametrize("prompt, answer, completion", [
    ("What is the largest of 3, 17, 9?", "17", "The largest is 17."),
    ("What is gcd(12, 4)?", "4", "gcd(12, 4) is 4"),
    ("What is 17 mod 20?", "17", "Since 17 < 20, the remainder is 17."),
    ("What is 7 + 0?", "7", "It is 7."),
    ("Multiply 6 by 1.", "6", "Multiplying 6 by 1 gives 6"),
    ("What is 1 * 236?", "236", "\\boxed{236}"),
    ("What is 1 * 236?", "236", "Working.\n#### 236"),
    ("What is 23 + 45?", "68", "Adding 23 and 45 gives 68"),
])
def test_an_answer_that_is_one_of_the_prompts_numbers_counts_when_marked(reward, prompt, answer, completion):
    assert reward(completion, {"prompt": prompt, "answer": answer}) == 1.0
