"""Issue #17's failure modes on real tiny-model runs: the pre-flight check, the settings fitted to a
task, cut-off answers, and the no-signal and checker-suspected alarms ending a run that cannot learn."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from tiny_run import count_a, metrics_lines, params, tiny_task, tiny_trainer

from grpo.config import DATA_MAX_NEW_TOKENS, TrainConfig
from grpo.config_resolution import DEFAULT_LR, settle_config
from grpo.math.loss import policy_loss
from grpo.observe.heldout import train_sample
from grpo.run.build import step_budget
from grpo.run.preflight import PreflightReport
from grpo.run.run_state import RunState, planned_schedule
from grpo.run.token_limit import fit_token_limit, stop_at_fitted_limit
from grpo.system.interrupt import RunStopped
from grpo.tasks import Task, load_task


def never(completion, example):
    """An impossible task: nothing the model writes is right."""
    return 0.0


def only_b(completion, example):
    """The held-out checker of the gamed run: a reply that is exactly 'b', which count_a never pays for."""
    return float(completion.strip() == "b")


def test_preflight_stops_a_run_that_cannot_learn_and_says_why(tmp_path):
    trainer = tiny_trainer(reward=never, preflight="on", steps=3)
    with pytest.raises(RunStopped) as stop:
        trainer.train(tmp_path / "run")
    assert "pre-flight check" in str(stop.value) and "solved none" in str(stop.value)
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert report["varying_frac"] == 0.0 and report["pass_rate"] == 0.0
    assert report["problems"][0]["kind"] == "no signal" and report["problems"][0]["fatal"]
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing trained, no finished-run record


def odd_length(completion, example):
    """Varies within almost every group of a random model: the pre-flight check finds signal at once."""
    return float(len(completion) % 2)


def right_or_raises(completion, example):
    """Right whenever it gives a verdict; raises (a checker bug) on odd lengths: no group varies among verdicts."""
    if len(completion) % 2:
        raise ValueError("checker cannot parse this")
    return 1.0


def test_preflight_counts_the_groups_that_vary_over_the_rows_training_keeps():
    from grpo.run.preflight import run_preflight

    trainer = tiny_trainer(reward=right_or_raises, preflight="warn", max_gen_rounds=1)
    with pytest.warns(RuntimeWarning, match="calls failed"):
        report = run_preflight(trainer.sampling, trainer.learner, fit=False)
    assert report.reward_errors["right_or_raises"] > 0, "the seed should give some failed calls"
    # the failed rows are no verdict (training leaves them out), so no group varies: not "the failures scored 0"
    assert report.varying_frac == 0.0 and report.all_correct_frac > 0.0 and report.all_wrong_frac == 0.0
    assert report.problems[0].kind == "no signal"


def test_preflight_passes_a_learnable_task_and_leaves_the_run_unchanged(tmp_path):
    # the check samples with its own generator: the run that follows is the run without it
    checked = tiny_trainer(reward=odd_length, preflight="on", steps=2)
    summary = checked.train(tmp_path / "a")
    plain = tiny_trainer(reward=odd_length, preflight="off", steps=2)
    plain.train(tmp_path / "b")
    assert summary["preflight"]["varying_frac"] > 0
    assert summary["stopped_early"] is None
    for name, value in params(checked).items():
        assert torch.equal(value, params(plain)[name]), name


def test_no_signal_alarm_ends_a_run_early_and_names_the_cause(tmp_path):
    trainer = tiny_trainer(reward=never, preflight="warn", steps=12, no_signal_steps=3)
    summary = trainer.train(tmp_path / "run")
    assert summary["steps"] == 3 and summary["steps_planned"] == 12
    assert summary["stopped_early"].startswith("no signal")
    assert summary["alarms"]["no_signal"] == 3
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["signal_frac"] for row in lines if "signal_frac" in row] == [0.0, 0.0, 0.0]
    assert lines[-2]["alarm/no_signal"] == 1.0


def test_without_early_stop_the_same_run_goes_on_with_the_alarm(tmp_path):
    trainer = tiny_trainer(reward=never, preflight="warn", steps=5, no_signal_steps=3, early_stop=False)
    summary = trainer.train(tmp_path / "run")
    assert summary["steps"] == 5 and summary["stopped_early"] is None and "no_signal" in summary["alarms"]


def test_checker_suspected_fires_on_a_run_that_games_its_training_reward(tmp_path):
    # the training reward (share of 'a') is learnable; the held-out checker ('b' exactly) never moves
    tokenizer = make_tokenizer()
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    task = Task("gamed", rows[:32], rows[32:], only_b)
    config = TrainConfig(temperature=1.0, sampler="uniform", filter_groups=False, steps=16, prompts_per_step=4,
                         group_size=4, max_new_tokens=6, lr=3e-2, warmup_steps=1, eval_size=8, eval_every=2,
                         device="cpu", save_model=False, reward_workers=0, preflight="off", log_every=0)
    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer

    setup_process(config)
    model = make_model(len(tokenizer), seed=3)
    trainer = GRPOTrainer(resolve_run(config, task=task, rewards=[count_a], model=model), model=model,
                          tokenizer=tokenizer, progress=False)
    summary = trainer.train(tmp_path / "run")
    assert summary["stopped_early"] is not None and summary["stopped_early"].startswith("checker suspected")
    assert summary["steps"] < 16
    assert "top-scoring completions" in summary["alarm_messages"]["checker_suspected"]
    assert summary["heldout_accuracy_end"] == 0.0


def test_rewards_see_which_completions_hit_the_token_limit():
    seen = []

    def spy(completion, example):
        seen.append((len(completion), example["truncated"]))
        return count_a(completion, example)

    trainer = tiny_trainer(reward=spy, max_new_tokens=3, steps=1)
    trainer.step(1)
    # three characters are three tokens for this tokenizer: a 3-character completion hit the limit
    assert seen and any(cut for _, cut in seen)
    assert all(cut == (n == 3) for n, cut in seen if n != 3) and all(cut for n, cut in seen if n == 3)


def test_mask_truncated_leaves_cut_completions_out_of_the_sequence_normaliser(monkeypatch):
    import grpo.learning.update
    import grpo.sampling.rounds
    from grpo.sampling.rollout import generate

    def half_cut(*args, **kwargs):  # as if the first two completions of each group had hit the token limit
        rollout = generate(*args, **kwargs)
        rollout.truncated.view(-1, rollout.group_size)[:, :2] = True
        rollout.truncated.view(-1, rollout.group_size)[:, 2:] = False
        return rollout

    seen = []

    def loss(*args, **kwargs):
        seen.append(kwargs["total_sequences"])
        return policy_loss(*args, **kwargs)

    monkeypatch.setattr(grpo.sampling.rounds, "generate", half_cut)
    monkeypatch.setattr(grpo.learning.update, "policy_loss", loss)
    trainer = tiny_trainer(reward=odd_length, mask_truncated=True, aggregate="sequence", steps=1,
                           skip_zero_advantage=False)
    trainer.step(1)
    assert seen and all(n == 4 * 2 for n in seen)  # 4 groups of 4, 2 of each cut: 8 sequences in the loss


def test_mask_truncated_leaves_cut_completions_out_of_the_loss(monkeypatch):
    import grpo.sampling.rounds
    from grpo.sampling.rollout import generate

    def all_cut(*args, **kwargs):  # as if every completion had hit the token limit
        rollout = generate(*args, **kwargs)
        rollout.truncated[:] = True
        return rollout

    monkeypatch.setattr(grpo.sampling.rounds, "generate", all_cut)
    masked = tiny_trainer(reward=odd_length, mask_truncated=True, steps=1)
    before = params(masked)
    metrics = masked.step(1)
    assert metrics["truncated_frac"] == 1.0 and metrics["nonfinite_skipped"] == 0
    assert all(torch.equal(v, params(masked)[k]) for k, v in before.items())  # nothing left to learn from
    kept = tiny_trainer(reward=odd_length, steps=1)
    before = params(kept)
    kept.step(1)
    assert any(not torch.equal(v, params(kept)[k]) for k, v in before.items())


def test_task_settings_fill_what_the_run_leaves_automatic():
    task = tiny_task()
    tuned = Task(task.name, task.train, task.heldout, task.reward, defaults={"max_new_tokens": 8})
    assert settle_config(TrainConfig(), tuned).max_new_tokens == 8
    assert settle_config(TrainConfig(max_new_tokens=5), tuned).max_new_tokens == 5  # the user's value wins
    assert settle_config(TrainConfig(), task).max_new_tokens == DATA_MAX_NEW_TOKENS == 256
    settled = settle_config(TrainConfig(steps=50), task)
    assert settled.eval_every == 0 and settled.alarm_window == 20  # eval_every is planned before step 1
    # under --minutes the run plans for 20 steps; config.json shows the window it uses (RunState.start's)
    budget = settle_config(TrainConfig(steps=100, minutes=10), task)
    assert budget.alarm_window == 10 == RunState.start(budget, auto_alarm_window=True).alarm_window
    assert settle_config(TrainConfig(steps=8, eval_every=-1), task).eval_every == -1
    assert settle_config(TrainConfig(), task).steps == 20  # a task without a step count: the general default
    assert settle_config(TrainConfig(), task).lr == DEFAULT_LR == 3e-5  # nor a learning rate
    assert settle_config(TrainConfig(), replace(tuned, defaults={"lr": 1e-4})).lr == 1e-4
    assert settle_config(TrainConfig(lr=2e-6), replace(tuned, defaults={"lr": 1e-4})).lr == 2e-6


def test_a_users_file_gets_a_time_budget_unless_the_run_names_its_steps(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} - 1?", "answer": str(i - 1)}) + "\n"
                            for i in range(40)))
    task = load_task("", data=str(data), heldout_size=8)
    first = settle_config(TrainConfig(), task)
    assert (first.steps, first.minutes, first.max_new_tokens) == (100, 10.0, DATA_MAX_NEW_TOKENS)
    named = settle_config(TrainConfig(steps=30), task)
    assert (named.steps, named.minutes) == (30, 0.0)  # the user's steps all run
    assert settle_config(TrainConfig(minutes=2), task).minutes == 2  # the user's budget wins
    # a user's file draws its prompts uniformly, a built-in task at the frontier, and a named sampler is kept
    assert first.sampler == "uniform" and settle_config(TrainConfig(sampler="frontier"), task).sampler == "frontier"
    # and learns at 1e-5 (bench/README.md, "Figures from issue 35"), unless the run names its rate
    assert first.lr == 1e-5 and settle_config(TrainConfig(lr=3e-5), task).lr == 3e-5
    assert settle_config(TrainConfig(), load_task("add")).sampler == "frontier"


def test_time_budget_ends_the_run_before_a_step_would_pass_it(tmp_path):
    # 0.01 minutes = 0.6 s: far less than the tiny run's first steps take together, so it stops after one
    # or a few steps, with the final evaluation, a checkpoint and the reason in the summary
    trainer = tiny_trainer(steps=50, minutes=0.01, eval_every=0)
    summary = trainer.train(tmp_path / "run")
    assert summary["out_of_time"] and summary["stopped_early"] is None
    assert 1 <= summary["steps"] < 50 and summary["steps_planned"] == 50
    assert summary["heldout_accuracy_end"] is not None
    assert (tmp_path / "run" / "checkpoints").is_dir()
    unlimited = tiny_trainer(steps=3, minutes=0).train(tmp_path / "plain")
    assert unlimited["steps"] == 3 and not unlimited["out_of_time"]
    # the run's generation totals: 3 steps of 4 groups (4 completions of 6 tokens at most), nothing screened
    gen = unlimited["generation"]
    assert gen["groups"] == 12 and 0 < gen["tokens"] <= 12 * 4 * 6 and gen["screen_seconds"] == 0.0
    assert 0.0 <= gen["wasted_frac"] <= 1.0 and gen["tokens_zero_var"] <= gen["tokens"]


def test_token_limit_fit_by_hand():
    # 19 completions end on their own, one is cut: p95 of [30..48] is 47 -> 1.5 * 47 = 70.5 -> 72
    lengths = list(range(30, 49)) + [256]
    cut = [False] * 19 + [True]
    wrong = [False] * 20
    assert fit_token_limit(lengths, cut, wrong, 256) == 72
    assert fit_token_limit([3] * 10, [False] * 10, wrong[:10], 256) == 48  # never below 48: room to show work
    assert fit_token_limit([100] * 10, [False] * 8 + [True] * 2, wrong[:10], 256) is None  # 20% cut: cannot tell
    # five correct completions with median 35 tokens: 1.5 * 35 = 52.5 -> 56, under the p95 rule's 72
    solved = [n in (30, 32, 35, 38, 48) for n in lengths]
    assert fit_token_limit(lengths, cut, solved, 256) == 56
    assert fit_token_limit(lengths, cut, [n in (30, 32, 35, 38) for n in lengths], 256) == 72  # four: too few
    # correct completions longer than the p95 rule allows do not raise the limit past it; the cut one is no answer
    assert fit_token_limit(lengths, cut, [n >= 44 for n in lengths[:19]] + [True], 256) == 72


def test_token_limit_keeps_nine_in_ten_of_the_correct_completions():
    # the subtraction file's shape: 118 wrong completions of 12..40 tokens, 10 correct: six bare answers
    # (4-6 tokens) and four that explain first (60-90). The median rule alone gives 1.5 x 6 -> 48 (the floor),
    # which cuts the four explanations: 60% of the correct kept. The 9th shortest correct is 80 -> 80.
    wrong_lengths = [12 + k % 29 for k in range(118)]
    solved_lengths = [4, 4, 5, 5, 6, 6, 60, 70, 80, 90]
    lengths = wrong_lengths + solved_lengths
    cut, correct = [False] * len(lengths), [False] * 118 + [True] * 10
    limit = fit_token_limit(lengths, cut, correct, 256)
    assert limit == 80
    assert sum(n <= limit for n in solved_lengths) / len(solved_lengths) >= 0.9
    # with few correct (under 5), the reach rule's 48 is raised the same way: 2 of 3 correct need 70 and 90
    few = [False] * 125 + [True] * 3
    lengths = wrong_lengths + [0] * 7 + [5, 70, 90]
    assert fit_token_limit(lengths, cut, few, 256, reach=[None] * 127 + [5]) == 96  # the 3rd of 3 (ceil 2.7)
    assert fit_token_limit(lengths, cut, few, 64, reach=[None] * 127 + [5]) == 64  # never above the probe's


def test_cli_preflight_reports_and_train_stops_with_one_line(tmp_path):
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(40)))
    common = ["--model", str(tmp_path / "tiny"), "--data", str(data), "--device", "cpu", "--group-size", "4",
              "--preflight-prompts", "4", "--max-new-tokens", "4", "--reward-workers", "0"]
    check = subprocess.run([sys.executable, "-m", "grpo", "preflight", *common],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert check.returncode == 1, check.stderr
    assert "pass rate 0.0%" in check.stdout and "no signal" in check.stdout
    train = subprocess.run([sys.executable, "-m", "grpo", "train", *common, "--output", "run", "--no-progress"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert train.returncode == 1
    assert train.stderr.strip().startswith("grpo train: pre-flight check: the model solved none of the 64 samples")
    assert "Traceback" not in train.stderr and len(train.stderr.strip().splitlines()) == 1
    assert (Path(tmp_path) / "run" / "preflight.json").is_file()


def test_with_few_correct_the_limit_follows_what_an_answer_needs_not_the_ramblings():
    # 20 completions that ramble: 18 cut at the probe's 256, so the lengths alone cannot tell (None before);
    # one of them reached the gold answer by token 40, another by 120: 1.5 x 40 -> 64
    lengths, cut, wrong = [256] * 18 + [150, 170], [True] * 18 + [False] * 2, [False] * 20
    assert fit_token_limit(lengths, cut, wrong, 256) is None
    reach = [None] * 17 + [120, 40, None]
    assert fit_token_limit(lengths, cut, wrong, 256, reach=reach, answer_lengths=[2] * 20) == 64
    # none reached it: the gold answers' lengths (2 tokens), never below 48
    assert fit_token_limit(lengths, cut, wrong, 256, reach=[None] * 20, answer_lengths=[2] * 20) == 48
    # when the ramblings end sooner than the answers need, their fit stays
    short, ended = [20] * 20, [False] * 20
    assert fit_token_limit(short, ended, wrong, 256, reach=[None] * 19 + [100]) == 48
    # five correct: the fit by the correct ones, as before
    assert fit_token_limit([30] * 20, ended, [True] * 5 + [False] * 15, 256, answer_lengths=[2] * 20) == 48


def test_the_gold_answer_is_found_anywhere_in_a_completion():
    from conftest import make_tokenizer

    from grpo.run.preflight_samples import answer_reach

    tokenizer = make_tokenizer()
    assert answer_reach(tokenizer, "ab b a", "b") == len(tokenizer.encode("ab", add_special_tokens=False))
    assert answer_reach(tokenizer, "aaaa", "b") is None and answer_reach(tokenizer, "aaaa", "") is None


def budget_report(**kw) -> PreflightReport:
    values = dict(prompts=16, group_size=8, max_new_tokens=256, pass_rate=0.05, reward_mean=0.05, varying_frac=0.25,
                  all_correct_frac=0.0, all_wrong_frac=0.75, truncated_frac=0.5, lengths={}, reward_errors={},
                  reward_timeouts={}, examples={}, seconds=60.0, step_seconds=150.0, update_seconds=30.0,
                  answer_limit=48)
    return PreflightReport(**{**values, **kw})


def test_the_step_budget_buys_steps_in_order_with_what_the_user_left():
    config = TrainConfig(minutes=10.0, max_new_tokens=256, steps=100)
    # 180 s a step: 3 steps fit in 10 minutes. 48 tokens of 256: 28 s generation + 30 s update -> 10 steps
    report = budget_report()
    assert step_budget(report, config, {"max_new_tokens", "max_gen_rounds", "group_size"}) == {"max_new_tokens": 48}
    assert report.steps_fit == 10 and report.adapted == [
        "step budget: max_new_tokens 256 -> 48 (what a correct answer needs)"]
    assert report.budget(10.0) == [
        "step budget: about 180 s a step (150 s generation, 30 s update): 3 steps fit in 10 minutes",
        "step budget: max_new_tokens 256 -> 48 (what a correct answer needs)",
        "step budget: 10 steps fit after these changes"]
    # the update shrinks with the completions the lower limit cuts: half the check's completions ran to
    # 256 tokens, half ended at 20: a mean of 138 tokens at 256, 34 at 48, so 30 s of update becomes 7.4 s
    report = budget_report(sample_lengths=[256] * 8 + [20] * 8)
    assert step_budget(report, config, {"max_new_tokens"}) == {"max_new_tokens": 48}
    assert report.steps_fit == int(600 // (150 * 48 / 256 + 30 * 34 / 138)) == 16
    # the user set the token limit: fewer rounds (4 needed at 25% varying -> 3), then groups of 4
    report = budget_report()
    assert step_budget(report, config, {"max_gen_rounds", "group_size"}) == {"max_gen_rounds": 3, "group_size": 4}
    assert report.steps_fit == int(600 // (150 * 3 / 4 / 2 + 15))
    # enough steps fit, or --no-adapt, or no budget: nothing changes
    assert step_budget(budget_report(step_seconds=20.0), config, {"group_size"}) == {}
    assert step_budget(budget_report(), replace(config, adapt=False), {"group_size"}) == {}
    assert step_budget(budget_report(), replace(config, minutes=0.0), {"group_size"}) == {}


def test_the_engine_starts_before_the_generation_estimate_is_timed():
    # with --engine vllm the first rollout started vLLM (167 s measured) inside the clock, and pre-flight
    # printed "about 433 s a step" for steps that took 23-26 s: the start now happens before it

    from grpo.run.preflight import start_engine

    class Engine:
        conn = None

        def start(self):
            self.conn = "ready"

    engine = Engine()
    assert start_engine(engine) is not None and engine.conn == "ready"
    assert start_engine(engine) is None  # started already: nothing to do
    assert start_engine(None) is None  # the own sampler


def test_the_fit_stops_sampling_at_the_limit_it_will_choose():
    # 20 rows: 19 have ended by token 10 (95%), so sampling stops at 1.5 x 10 -> 15, at least 48 tokens
    stop = stop_at_fitted_limit(20, 256)
    assert not stop(9, 2) and not stop(10, 1) and not stop(47, 1) and stop(48, 1)
    late = stop_at_fitted_limit(20, 256)
    assert not late(100, 2) and not late(120, 1) and not late(175, 1) and late(184, 1)  # 1.5 x 120 -> 184


def test_the_automatic_schedule_is_fixed_before_step_1_from_the_plan_alone():
    # 5 evaluations during the planned steps; under a time budget the plan is 20 steps at most, whatever
    # the machine's pace (the schedule and the alarm window used to follow step 1's measured time)
    assert planned_schedule(20, 0.0) == (4, 20)
    assert planned_schedule(40, 0.0) == (5, 40)  # at least every 5 steps
    assert planned_schedule(100, 10.0) == (4, 20)
    assert planned_schedule(12, 10.0) == (3, 12)
    state = RunState.start(tiny_trainer(steps=40, eval_every=0).config, auto_alarm_window=True)
    assert (state.eval_every, state.alarm_window) == (5, 20)
    budget = tiny_trainer(steps=100, minutes=1.0, alarm_window=0, eval_every=0)
    state = RunState.start(budget.config, auto_alarm_window=budget.auto_alarm_window)
    assert (state.eval_every, state.alarm_window) == (4, 10)
    kept = tiny_trainer(steps=100, minutes=1.0, alarm_window=15, eval_every=3)
    state = RunState.start(kept.config, auto_alarm_window=kept.auto_alarm_window)
    assert (state.eval_every, state.alarm_window) == (3, 15)  # the user's settings stay


def test_the_training_sample_is_scored_beside_the_heldout_subset(tmp_path):
    # 10 planned steps: evaluations at 2, 4, 6, 8 (every 10/5), the start and the end; each scores the
    # held-out subset (here all 8 held-out prompts) and a fixed sample of 6 training prompts
    trainer = tiny_trainer(steps=10, eval_every=0, eval_train=6)
    summary = trainer.train(tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    scored = [r["step"] for r in rows if "train_sample_accuracy" in r]
    assert scored == [0, 2, 4, 6, 8, 10] and summary["eval_every"] == 2
    assert all(0.0 <= r["train_sample_accuracy"] <= 1.0 for r in rows if "train_sample_accuracy" in r)
    assert train_sample(trainer.sampling) == train_sample(trainer.sampling) and len(train_sample(trainer.sampling)) == 6  # fixed by the seed


def test_a_resumed_run_stops_where_the_straight_run_stops(tmp_path):
    # the alarms' history travels in the checkpoint: the no-signal count goes on across the resume
    straight = tiny_trainer(reward=never, steps=8, no_signal_steps=3, early_stop=True).train(tmp_path / "a")
    tiny_trainer(reward=never, steps=2, no_signal_steps=3, early_stop=True).train(tmp_path / "b")
    resumed = tiny_trainer(reward=never, steps=8, no_signal_steps=3, early_stop=True).train(tmp_path / "b", resume=True)
    assert straight["steps"] == resumed["steps"] == 3
    assert straight["stopped_early"] == resumed["stopped_early"]


def test_first_tries_and_repeats_are_logged_and_survive_a_resume(tmp_path):
    # 32 training prompts, 8 drawn a step: step 1 is all first tries, and by step 6 (48 draws) prompts repeat
    trainer = tiny_trainer(steps=6, prompts_per_step=8)
    trainer.train(tmp_path / "run")
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "repeat_frac" in m]
    assert steps[0]["repeat_frac"] == 0.0 and 0.0 <= steps[0]["reward_first_try"] <= 1.0
    assert steps[-1]["repeat_frac"] > 0.0
    assert int(trainer.draws.counts.sum()) == 48
    resumed = tiny_trainer(steps=6, prompts_per_step=8)
    tiny_trainer(steps=3, prompts_per_step=8).train(tmp_path / "half")
    resumed.train(tmp_path / "half", resume=True)
    assert (resumed.draws.counts == trainer.draws.counts).all()  # the counts travel in the checkpoint


def test_a_reward_that_fails_on_every_completion_is_the_fatal_problem_named():
    # a user's reward that raises on every completion: every row errored, so "no signal" would blame the data
    from grpo.run.preflight import find_problems

    report = budget_report(varying_frac=0.0, all_wrong_frac=1.0, reward_errors={"exact_int": 128.0})
    problems = find_problems(report, ["exact_int"], [])
    assert [p.kind for p in problems] == ["reward errors"] and problems[0].fatal  # one line, no "no signal"
    assert problems[0].message.startswith("reward exact_int failed on every one of the 128 completions")
    # failing on some: a warning, and the data's own verdict stands
    some = find_problems(budget_report(reward_errors={"exact_int": 5.0}), ["exact_int"], [])
    assert not any(p.fatal for p in some) and any(p.kind == "reward errors" for p in some)
    # beside another reward, the broken one (constant: nothing scored) is named once, as broken
    two = find_problems(report, ["exact_int", "fmt"], ["exact_int"])
    assert [p.kind for p in two] == ["reward errors"]


def always_raises(completion, example):
    return int(completion)  # a TRL-style reward's bare int(): prose raises ValueError


def test_a_run_whose_reward_always_raises_stops_in_preflight_naming_it(tmp_path):
    trainer = tiny_trainer(reward=always_raises, preflight="on", steps=2)
    with pytest.raises(RunStopped) as stop:
        trainer.train(tmp_path / "run")
    assert "failed on every one of the" in str(stop.value) and "always_raises" in str(stop.value)
    assert "solved none" not in str(stop.value)


def test_the_step_budget_through_grpo_train_changes_only_what_the_user_left(tmp_path, capsys):
    """`grpo train --data FILE --minutes M` end to end: with far too little time (0.06 s) for 10 steps the
    budget changes the generation rounds and the group size the user left at their defaults, never one
    named on the command line or in a config file, nothing under --no-adapt; config.json and
    preflight.json hold what the run used."""
    from grpo.cli import main as cli_main

    tokenizer = make_tokenizer()
    model = tmp_path / "tiny"
    make_model(len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(60)))
    given = tmp_path / "given.yaml"
    given.write_text("group_size: 8\nmax_gen_rounds: 4\nlr: 2.0e-5\n")
    worker = Path(__file__).parent / "distributed_worker.py"

    def run(name: str, *extra: str) -> tuple[dict, dict, str]:
        capsys.readouterr()
        assert cli_main(["train", "--model", str(model), "--data", str(data), "--rewards",
                         f"{worker}:rare_first_char", "--minutes", "0.001", "--preflight", "warn",
                         "--max-new-tokens", "16", "--eval-size", "4", "--device", "cpu", "--no-progress",
                         "--no-save-model", "--output", str(tmp_path / name), *extra]) == 0
        out = capsys.readouterr().out
        config = json.loads((tmp_path / name / "config.json").read_text())
        return config, json.loads((tmp_path / name / "preflight.json").read_text()), out

    config, report, out = run("plain")
    assert config["group_size"] == 4 and config["max_gen_rounds"] < 4 and "step budget: group_size 8 -> 4" in out
    assert "step budget: group_size 8 -> 4" in report["adapted"] and report["steps_fit"] < 10
    assert config["lr"] == 1e-5  # a --data file's learning rate
    config, report, out = run("cli", "--group-size", "8")
    assert config["group_size"] == 8 and config["max_gen_rounds"] < 4 and "group_size 8 ->" not in out
    config, report, out = run("file", "--config", str(given))
    assert (config["group_size"], config["max_gen_rounds"]) == (8, 4) and "group_size 8 ->" not in out
    assert config["lr"] == 2e-5
    config, report, out = run("no-adapt", "--no-adapt")
    assert (config["group_size"], config["max_gen_rounds"]) == (8, 4) and report["adapted"] == []
    assert "steps fit in 0.001 minutes" in out and "->" not in "".join(
        line for line in out.splitlines() if line.startswith("step budget"))


def test_the_announcement_says_that_rounds_of_new_prompts_follow_while_no_group_varies(capsys):
    """A check of 16 prompts that found no varying group samples 64 (4 rounds): the first line says it may."""
    from types import SimpleNamespace

    from grpo.run.preflight import _announce

    generation = SimpleNamespace(world=SimpleNamespace(is_main=True))
    _announce(SimpleNamespace(config=TrainConfig(max_gen_rounds=4), generation=generation))
    assert "up to 4 rounds of new prompts while no group varies" in capsys.readouterr().out
    _announce(SimpleNamespace(config=TrainConfig(max_gen_rounds=1), generation=generation))
    assert "rounds" not in capsys.readouterr().out


@pytest.mark.parametrize("minutes", [5.0, 0.0])
def test_only_a_time_budget_lets_the_measured_pace_change_a_run(tmp_path, monkeypatch, minutes):
    """Why two runs of one command can differ (issue 52): under a time budget (--minutes; a --data run's
    default without --steps) the pre-flight check's measured pace decides, when fewer than 10 steps fit,
    the run's group_size and generation rounds, so a run slowed by other work on the machine is another
    run. With no time budget the pace changes nothing: the runs are the same row by row (docs/gpu.md)."""
    import grpo.run.trainer

    measured = grpo.run.trainer.run_preflight

    def at_pace(seconds: float):
        def run_preflight(*args, **kwargs):
            report = measured(*args, **kwargs)
            report.step_seconds = report.update_seconds = seconds  # as a busy or an idle machine measures it
            return report
        return run_preflight

    runs = []
    for name, seconds in (("idle", 0.01), ("busy", 60.0)):
        monkeypatch.setattr(grpo.run.trainer, "run_preflight", at_pace(seconds))
        trainer = tiny_trainer(steps=3, minutes=minutes, preflight="warn", filter_groups=True,
                                   not_given=("group_size",))  # G 8, the default: the budget may adapt it
        trainer.train(tmp_path / name)
        runs.append((trainer.config.group_size, trainer.config.max_gen_rounds, metrics_lines(tmp_path / name)))
    (idle_group, idle_rounds, idle), (busy_group, busy_rounds, busy) = runs
    if minutes:  # 2 minutes a step leave 2 steps of 5 minutes: the budget halves the groups, fewer rounds
        assert (idle_group, busy_group) == (8, 4) and busy_rounds < idle_rounds
        assert idle != busy
    else:
        assert (idle_group, idle_rounds) == (busy_group, busy_rounds) and idle == busy
