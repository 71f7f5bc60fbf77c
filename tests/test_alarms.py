"""Each alarm on synthetic metric streams that should, and should not, trigger it; the verdicts on
learning (stall, checker suspected, memorising) on simulated runs calibrated on measured ones
(tests/alarm_simulation.py), at the error rates bench/README.md states."""

import alarm_simulation as sim
import numpy as np
import pytest

import grpo.observe.alarm_monitor as alarm_monitor
import grpo.observe.alarms as alarms
from grpo.observe.alarm_monitor import AlarmMonitor
from grpo.observe.alarms import AlarmConfig, fitted_change, memorising

STEPS = 40
CFG = AlarmConfig()  # window 20


def noise(seed: int, scale: float = 0.05) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, STEPS)


def healthy(seed: int = 0) -> list[dict]:
    """Reward 0.1 -> 0.7 with noise, held-out accuracy rising every 5 steps, stable length and entropy."""
    reward = np.linspace(0.1, 0.7, STEPS) + noise(seed)
    stream = []
    for i in range(STEPS):
        step = i + 1
        m = {"reward_mean": float(reward[i]), "adv_nonzero_frac": 0.6, "completion_len": 6.0 + noise(seed + 1)[i],
             "repeat_ngram_frac": 0.02, "entropy": 0.8 - 0.01 * i, "signal_frac": 0.7}
        if step % 5 == 0:
            m["heldout_accuracy"] = 0.1 + 0.5 * step / STEPS
        stream.append(m)
    return stream


def run(stream: list[dict], heldout_start: float | None = 0.1) -> dict[str, int]:
    """Feed a stream through the monitor; return each alarm's first step."""
    monitor = AlarmMonitor(STEPS, CFG)
    first: dict[str, int] = {}
    if heldout_start is not None:
        monitor.observe(0, {"heldout_accuracy": heldout_start})
    for step, metrics in enumerate(stream, start=1):
        flags, warnings = monitor.observe(step, metrics)
        for name, on in flags.items():
            if on:
                first.setdefault(name.removeprefix("alarm/"), step)
        assert len(warnings) <= sum(flags.values())
    return first


def with_changes(stream: list[dict], **columns) -> list[dict]:
    return [{**m, **{k: float(v[i]) for k, v in columns.items()}} for i, m in enumerate(stream)]


def test_fitted_change_of_a_line_and_of_nans():
    assert fitted_change([0.0, 1.0, 2.0, 3.0]) == pytest.approx(3.0)
    assert fitted_change([1.0, float("nan"), 3.0]) == pytest.approx(2.0)
    assert fitted_change([5.0]) == 0.0


def test_length_growing_without_reward():
    longer = np.linspace(6.0, 14.0, STEPS)
    flat = 0.3 + noise(2, 0.02)
    stream = with_changes(healthy(), reward_mean=flat, completion_len=longer, adv_nonzero_frac=np.zeros(STEPS))
    assert "length_without_reward" in run(stream)
    # the same growth while reward rises is allowed (longer reasoning that pays off)
    assert "length_without_reward" not in run(with_changes(healthy(), completion_len=longer))


def test_repetition_rising():
    stream = with_changes(healthy(), repeat_ngram_frac=np.linspace(0.0, 0.5, STEPS))
    first = run(stream)
    assert "repetition_rising" in first
    steady = with_changes(healthy(), repeat_ngram_frac=0.3 + noise(3, 0.03))
    assert "repetition_rising" not in run(steady)


def test_entropy_collapse_only_early():
    collapsed = with_changes(healthy(), entropy=np.full(STEPS, 0.01))
    assert run(collapsed).get("entropy_collapse") == 1
    # low entropy late in training is convergence, not collapse
    late = with_changes(healthy(), entropy=np.r_[np.full(20, 0.8), np.full(20, 0.01)])
    assert "entropy_collapse" not in run(late)
    # steps with no update log NaN entropy; they are skipped
    skipped = with_changes(healthy(), entropy=np.full(STEPS, np.nan))
    assert "entropy_collapse" not in run(skipped)


def test_an_alarm_warns_once_when_it_turns_on_and_flags_every_step():
    monitor = AlarmMonitor(STEPS, CFG)
    warned, flagged = [], 0
    for step, m in enumerate(with_changes(healthy(), entropy=np.full(STEPS, 0.01)), start=1):
        flags, warnings = monitor.observe(step, m)
        warned += list(warnings.values())
        flagged += flags["alarm/entropy_collapse"] == 1.0
    assert len(warned) == 1 and warned[0].startswith("entropy collapse")
    assert flagged == STEPS // 4  # on through the first quarter, then out of the "early" window


def test_no_signal_fires_after_no_signal_steps_low_steps_in_a_row():
    # 4 low steps, 1 healthy, then 5 low: the alarm waits for 5 in a row (step 10)
    signal = np.array([0.1] * 4 + [0.5] + [0.125] * 5 + [0.6] * (STEPS - 10))
    first = run(with_changes(healthy(), signal_frac=signal))
    assert first.get("no_signal") == 10


def test_a_run_that_trained_on_next_to_nothing_says_so_at_its_end_unless_no_signal_did():
    # 4 steps, none varying: too few for no_signal (5 in a row); 1 of 4 varying: a mean of 12.5%, under 25%
    assert alarms.little_signal([0.0] * 4, [], CFG).startswith("little signal: none of the 4 steps")
    said = alarms.little_signal([0.0, 0.5, 0.0, 0.0], [], CFG)
    assert said.startswith("little signal: 1 of the 4 steps") and "docs/alarms.md, no_signal" in said
    assert alarms.little_signal([0.0] * 6, ["no_signal"], CFG) is None  # the alarm said it already
    assert alarms.little_signal([0.25] * 4, [], CFG) is None and alarms.little_signal([], [], CFG) is None


def test_trend_alarms_that_take_turns_count_together_toward_the_stop(monkeypatch):
    # measured on a multiplication file: stall, then checker_suspected, then stall again, each on for
    # fewer than two evaluations; the run learned nothing and must stop, with the alarm that is on now
    from grpo.observe.alarms import ALARMS

    monitor = AlarmMonitor(40, AlarmConfig(window=6))
    turns = iter([{"stall": "stall: a"}, {}, {"stall": "stall: b"}, {"checker_suspected": "checker suspected: c"}])
    monkeypatch.setattr(monitor, "_check", lambda step: {**dict.fromkeys(ALARMS), **next(turns)})
    monitor.observe(1, {"heldout_subset_accuracy": 0.2})
    assert monitor.stopping() is None  # held at one evaluation
    monitor.observe(2, {"heldout_subset_accuracy": 0.2})
    assert monitor.stopping() is None  # a step with none on starts the count again
    monitor.observe(3, {"heldout_subset_accuracy": 0.2})
    monitor.observe(4, {"heldout_subset_accuracy": 0.2})
    assert monitor.stopping() == "checker suspected: c"
    state = monitor.state()
    again = AlarmMonitor(40, AlarmConfig(window=6))
    again.load_state(state)
    assert again.trend_held == 2



# Of 40 simulated runs of each kind (seed 0): learners, runs warned by any alarm and runs stopped;
# failures, runs caught by their alarm and runs stopped. bench/README.md states these numbers.
# The reported shapes (sharpening, frontier) are counted as learners are, held to no target.
RATES = {"slow": (0, 0), "fast": (0, 0), "slow_budget": (1, 0), "sharpening": (15, 13), "frontier": (14, 13),
         "stall": (31, 0), "checker": (36, 0), "no_signal": (40, 40), "memorising": (36, 0)}
TARGET = {"warned": 2, "stopped": 1, "caught": 36}  # of 40: learners at most, failures at least
NOTED_STALLS = 5  # stalled runs not caught whose subset rose 1 sd by chance: said "slow progress" instead


def test_the_simulated_error_rates_are_those_readme_states():
    assert sim.rates(seed=0) == RATES
    stalled, names = sim.FAILURES["stall"]
    assert sum(m.noted and not m.raised & set(names) for m in sim.runs(stalled)) == NOTED_STALLS
    for kind in sim.LEARNERS:  # the targets hold on this seed (over 200 runs they do not all: bench/README.md)
        assert RATES[kind][0] <= TARGET["warned"] and RATES[kind][1] <= TARGET["stopped"]
    for kind in sim.FAILURES:  # a stalled run is caught by stall, or said to progress slowly (item 15's price)
        assert RATES[kind][0] + (NOTED_STALLS if kind == "stall" else 0) >= TARGET["caught"]


@pytest.mark.parametrize(("rule", "failure"), [("stall", "stall"), ("checker_suspected", "checker"),
                                               ("no_signal", "no_signal"), ("memorising", "memorising")])
def test_each_failure_is_caught_only_by_its_rule(monkeypatch, rule, failure):
    # with the rule removed, none of the runs that fail its way is caught: no other rule covers for it
    kind, names = sim.FAILURES[failure]
    caught = lambda: sum(bool(m.raised & set(names)) for m in sim.runs(kind))  # noqa: E731
    assert caught() == RATES[failure][0]
    monkeypatch.setattr(alarm_monitor, rule, lambda *args, **kw: None)
    assert caught() == 0


def replay(steps: int, reward: list[float], heldout: dict[int, float], train: dict[int, float] | None = None,
           window: int = 10, *, whole: dict[int, float] | None = None, checked: bool = False,
           messages: dict[str, str] | None = None, repeats: list[float] | None = None,
           **sizes: int) -> dict[str, int]:
    """Feed measured series through the monitor as the trainer does (the last evaluation final); return
    each alarm's first step. ``whole``: the whole held-out set's accuracy (start and end); ``checked``:
    the reward is the task's checker, so the step's ``accuracy`` is its reward's; ``messages``: filled
    with each alarm's first message; ``repeats``: each step's share of groups at a prompt drawn before
    (none: not logged); ``sizes``: heldout_n, full_n."""
    monitor = AlarmMonitor(steps, AlarmConfig(window=window, **sizes))
    raised: dict[str, int] = {}

    def observe(step: int, m: dict, final: bool = False) -> None:
        for name, message in monitor.observe(step, m, final=final)[1].items():
            raised.setdefault(name, step)
            if messages is not None:
                messages.setdefault(name, message)

    def evaluation(step: int) -> dict:
        return {"heldout_subset_accuracy": heldout[step],
                **({"train_sample_accuracy": train[step]} if train else {}),
                **({"heldout_accuracy": whole[step]} if whole and step in whole else {})}

    observe(0, evaluation(0))
    for step in range(1, steps + 1):
        m = {"reward_mean": reward[step - 1], "adv_nonzero_frac": 0.4, "signal_frac": 0.6, "completion_len": 11.5,
             "repeat_ngram_frac": 0.0, "entropy": 0.3, **({"accuracy": reward[step - 1]} if checked else {}),
             **({"repeat_frac": repeats[step - 1]} if repeats else {})}
        observe(step, {**m, **(evaluation(step) if step in heldout and step < steps else {})})
    observe(steps, evaluation(steps), final=True)
    return raised


def test_the_default_run_that_cried_wolf_raises_nothing():
    # `grpo train` (add), measured on a busy machine: the 128-prompt subset read 57%, 71%, 54%, 68% at steps
    # 4, 8, 12, 16 while the full held-out rose 16.4% -> 71.5%; it raised stall, checker_suspected and
    # reward_up_accuracy_down. The reward is a measured default run's (its last ten steps a plateau)
    reward = [0.3, 0.45, 0.55, 0.6, 0.7, 0.68, 0.83, 0.71, 0.75, 0.88,
              0.8125, 0.9196, 0.8080, 0.8711, 0.8945, 0.8477, 0.8973, 0.8672, 0.8828, 0.9219]
    heldout = {0: 0.164, 4: 0.57, 8: 0.71, 12: 0.54, 16: 0.68, 20: 0.715}
    assert replay(20, reward, heldout) == {}


def test_a_slow_noisy_subtraction_run_is_not_stopped():
    # two-digit subtraction, measured: the subset 2.3% -> 10.9% with dips while the full held-out rose
    # 5.5% -> 17.6% in 10 steps, and the stall stopped it. The reward and the dips between the measured
    # ends are made up to match: a slow rise of 0.12 under the batch's noise
    rng = np.random.default_rng(0)
    reward = list(np.linspace(0.08, 0.2, 10) + rng.normal(0, 0.04, 10))
    heldout = {0: 0.023, 2: 0.055, 4: 0.031, 6: 0.086, 8: 0.062, 10: 0.109}
    assert replay(10, reward, heldout, window=6) == {}


EVERY_4 = [0, 4, 8, 12, 16, 20, 24, 28, 32]  # a --data run under --minutes: planned for 20 steps, so every 4


def test_a_subtraction_run_at_the_frontier_whose_held_out_rose_is_no_stall():
    # issue 34, item 16: `grpo train --data` on two-digit subtractions drawing at the frontier, out of time
    # at step 26: the subset (96 prompts) 3.1% -> 13.5%, the whole held-out set (256) 5.5% -> 17.2%, raw
    # reward +0.037, and stall warned at step 26. Measured: the ends and the reward's change. Made up to
    # match: the subset's dips between the ends, the training sample's 32 prompts, and the reward's steps
    # (+0.037 under the batch's noise), chosen so that the old rules warn where they did, at step 26 alone
    reward = [0.283, 0.331, 0.075, 0.224, 0.297, 0.322, 0.284, 0.339, 0.27, 0.29, 0.272, 0.201, 0.219,
              0.296, 0.243, 0.358, 0.363, 0.398, 0.293, 0.381, 0.248, 0.258, 0.316, 0.332, 0.223, 0.219]
    steps = [*EVERY_4[:7], 26]
    heldout = {s: n / 96 for s, n in zip(steps, [3, 7, 4, 9, 5, 8, 6, 13], strict=True)}
    train = {s: n / 32 for s, n in zip(steps, [2, 1, 3, 2, 2, 3, 2, 3], strict=True)}
    whole = {0: 14 / 256, 26: 44 / 256}
    assert replay(26, reward, heldout, train, whole=whole, heldout_n=96, full_n=256) == {}
    # the same subset, with the whole set as flat as the subset's line says: the subset alone rose beyond its
    # noise (1 sd), not by the 2 that count as learning: slow progress, a note, no stall (issue 52, item 15)
    flat = {0: 14 / 256, 26: 24 / 256}
    assert replay(26, reward, heldout, train, whole=flat, heldout_n=96, full_n=256) == {"slow_progress": 26}


ISSUE_52_REWARD = [0.098, 0.126, 0.105, 0.027, 0.141, 0.122, 0.077, 0.137, 0.13, 0.13, 0.121, 0.151, 0.09, 0.123,
                   0.111]  # made up to match: +0.025 over 15 steps under the batch's noise


def test_held_out_accuracy_that_rose_beyond_its_noise_is_no_stall_but_a_slow_progress_note():
    # issue 52, item 15: a file of short-answer questions, no options, 15 steps: the whole held-out set 0.4%
    # -> 2.3% (256 prompts), and at step 15 "stall: raw reward changed +0.025 over 15 steps, held-out
    # accuracy 0.0% -> 5.2%, training sample 0.0% -> 0.0%". Measured: those ends. Made up to match: the
    # subset's (96) steps between its ends, evaluations every 3 steps, and the reward's steps, chosen so
    # that the old rule warns as it did
    steps = [0, 3, 6, 9, 12, 15]
    heldout = {s: n / 96 for s, n in zip(steps, [0, 1, 1, 2, 3, 5], strict=True)}
    train = dict.fromkeys(steps, 0.0)
    messages: dict[str, str] = {}
    raised = replay(15, ISSUE_52_REWARD, heldout, train, window=15, whole={0: 1 / 256, 15: 6 / 256},
                    messages=messages, heldout_n=96, full_n=256)
    assert raised == {"slow_progress": 15}  # no stall: a note
    said = messages["slow_progress"]
    assert said.startswith("slow progress: held-out accuracy rose by 1.95 sd of its noise, under the 2")
    assert ("raw reward changed +0.025 over 15 steps, held-out accuracy 0.0% -> 5.2%, whole held-out set "
            "0.4% -> 2.3%, training sample 0.0% -> 0.0%") in said
    # the subset as flat as its noise, and the whole set too: that is a stall, and says so
    flat = {s: n / 96 for s, n in zip(steps, [0, 1, 0, 0, 1, 0], strict=True)}
    messages.clear()
    assert replay(15, ISSUE_52_REWARD, flat, train, window=15, whole={0: 1 / 256, 15: 1 / 256}, messages=messages,
                  heldout_n=96, full_n=256) == {"stall": 15}
    assert messages["stall"].startswith("stall: raw reward changed +0.025 over 15 steps, held-out accuracy 0.0%")


def test_a_run_says_the_note_apart_from_its_alarms_and_keeps_it_apart(capsys):
    # the issue's series through the run's log: said as a note, kept as summary.json's `notes`, no alarm
    from grpo.observe.progress import StepProgress
    from grpo.run.step_metrics import RunLog

    log = RunLog(AlarmMonitor(15, AlarmConfig(window=15, heldout_n=96, full_n=256)), None,
                 StepProgress(15, enabled=False))
    heldout = {s: n / 96 for s, n in zip([0, 3, 6, 9, 12, 15], [0, 1, 1, 2, 3, 5], strict=True)}
    whole = {0: 1 / 256, 15: 6 / 256}

    def evaluation(step: int) -> dict:
        return {"heldout_subset_accuracy": heldout[step], "train_sample_accuracy": 0.0,
                **({"heldout_accuracy": whole[step]} if step in whole else {})}

    log.record(0, evaluation(0))
    for step in range(1, 16):
        log.record(step, {"reward_mean": ISSUE_52_REWARD[step - 1], "adv_nonzero_frac": 0.4, "signal_frac": 0.6,
                          **(evaluation(step) if step in heldout and step < 15 else {})})
    log.record(15, evaluation(15), final=True)
    assert list(log.notes) == ["slow_progress"] and log.messages == {} and log.raised == {}
    assert "note (step 15): slow progress: held-out accuracy rose by 1.95 sd" in capsys.readouterr().out


def stopped_at(steps: int, heldout: dict[int, float], window: int = 10) -> tuple[int | None, dict[str, str]]:
    """Issue 52's reward (repeated) and ``heldout`` (the subset; the training sample at 0%) fed as the
    trainer does with --early-stop: the step the monitor stopped the run at (None: ran to the end) and
    what it said (alarms and notes)."""
    monitor = AlarmMonitor(steps, AlarmConfig(window=window))
    said: dict[str, str] = {}
    monitor.observe(0, {"heldout_subset_accuracy": heldout[0], "train_sample_accuracy": 0.0})
    for step in range(1, steps + 1):
        m = {"reward_mean": ISSUE_52_REWARD[(step - 1) % 15], "adv_nonzero_frac": 0.4, "signal_frac": 0.6}
        if step in heldout:
            m.update(heldout_subset_accuracy=heldout[step], train_sample_accuracy=0.0)
        said.update(monitor.observe(step, m, final=step == steps)[1])
        if monitor.stopping():
            return step, said
    return None, said


def test_a_flat_held_out_series_stalls_and_stops_the_run_a_slowly_rising_one_is_noted_and_runs_on():
    every_3 = range(0, 31, 3)
    flat = {s: n / 96 for s, n in zip(every_3, [1, 0, 2, 1, 0, 1, 2, 0, 1, 1, 0], strict=True)}
    step, said = stopped_at(30, flat)
    assert step is not None and set(said) == {"stall"}
    rising = {s: n / 96 for s, n in zip(every_3, [0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5], strict=True)}
    step, said = stopped_at(30, rising)
    assert step is None and set(said) == {"slow_progress"}


def test_the_slow_progress_note_never_counts_towards_a_stop(monkeypatch):
    from grpo.observe.alarms import ALARMS

    monitor = AlarmMonitor(40, AlarmConfig(window=6))
    monkeypatch.setattr(alarm_monitor, "slow_progress", lambda *args, **kw: "slow progress: x")
    turns = iter([{"stall": "stall: a"}, {}, {}, {}, {"stall": "stall: b"}])
    monkeypatch.setattr(monitor, "_check", lambda step: {**dict.fromkeys(ALARMS), **next(turns)})
    flags, said = monitor.observe(1, {"heldout_subset_accuracy": 0.2})
    assert monitor.stopping() is None and "slow_progress" not in said
    for step in (2, 3, 4):  # the note on at every evaluation: said once, no flag, no stop
        flags, said = monitor.observe(step, {"heldout_subset_accuracy": 0.2})
        assert monitor.stopping() is None and monitor.trend_held == 0
        assert set(said) == ({"slow_progress"} if step == 2 else set()) and not any(flags.values())
    monitor.observe(5, {"heldout_subset_accuracy": 0.2})  # a stall after notes: held at one evaluation
    assert monitor.trend_held == 1 and monitor.stopping() is None


def test_a_times_table_run_that_sharpens_is_not_a_suspected_checker():
    # issue 34, item 16: `grpo train --data` on a 144-row times table, out of time at step 35: raw reward
    # +0.319 while greedy accuracy rose 71.7% -> 81.7% on 60 held-out prompts and 84.4% -> 96.9% on the
    # training sample (32); checker_suspected warned at step 35. Measured: those ends and the reward's
    # change. Made up: the dips between the ends and the reward's steps (0.50 -> 0.82: sampled completions
    # closing on greedy accuracy as the policy sharpens). The reward is the checker (exact match), so the
    # step's `accuracy` is its reward's
    reward = [0.497, 0.53, 0.515, 0.443, 0.563, 0.549, 0.51, 0.575, 0.574, 0.579, 0.576, 0.611, 0.556, 0.594,
              0.588, 0.651, 0.633, 0.625, 0.61, 0.646, 0.669, 0.664, 0.752, 0.747, 0.57, 0.621, 0.716, 0.713,
              0.754, 0.764, 0.868, 0.716, 0.762, 0.893, 0.832]
    steps = [*EVERY_4, 35]
    heldout = {s: n / 60 for s, n in zip(steps, [43, 44, 46, 45, 47, 46, 48, 47, 49, 49], strict=True)}
    train = {s: n / 32 for s, n in zip(steps, [27, 28, 29, 28, 30, 30, 31, 30, 31, 31], strict=True)}
    said: dict[str, str] = {}
    assert replay(35, reward, heldout, train, checked=True, heldout_n=60, full_n=60) == {}
    # without the checker's verdict on the samples (no `accuracy`: a run logged before it was), nothing is
    # taken for sharpening, and the same run warns as it did
    assert replay(35, reward, heldout, train, heldout_n=60, full_n=60, messages=said) == {"checker_suspected": 35}
    assert "raw training reward +0.319 over 35 steps while held-out accuracy 71.7% -> 81.7%" in said["checker_suspected"]


def test_sharpening_counts_the_sampled_accuracy_closing_on_greedy_and_nothing_the_checker_does_not_pass():
    steps = [0, 4, 8, 12, 16, 20]
    train = [(s, 0.85 + 0.1 * s / 20) for s in steps]  # greedy on the training sample 0.85 -> 0.95
    sampled = list(np.linspace(0.5, 0.8, 21))  # the checker's verdict on the samples 0.5 -> 0.8
    noise = alarms.accuracy_change(train, 32)[1] / 2  # the gap's shrinking is counted less this
    # the gap below greedy shrank from 0.35 to 0.15: 0.2 of the rise is sharpening
    assert alarms.sharpening(sampled, sampled, train, 32) == pytest.approx(0.2 - noise)
    # a reward rising while the checker's verdict stays flat closes no gap: none of it is sharpening
    assert alarms.sharpening(sampled, [0.5] * 21, train, 32) == 0.0
    # a sampled accuracy above greedy has no gap to close; nor does a run without the checker's verdict
    assert alarms.sharpening(sampled, sampled, [(s, 0.4) for s in steps], 32) == 0.0
    assert alarms.sharpening(sampled, [], train, 32) == 0.0


def test_the_whole_held_out_set_counts_only_at_an_evaluation_that_scored_it():
    cfg = AlarmConfig(heldout_n=96, full_n=256)
    heldout = [(0, 0.05), (4, 0.06), (8, 0.1)]
    assert alarms._whole_set_z([(0, 0.055), (8, 0.172)], heldout, cfg) == pytest.approx(
        0.117 / np.sqrt(2 * 0.1135 * 0.8865 * (1 / 256 + alarms.OVERDISPERSION)))
    assert alarms._whole_set_z([(0, 0.055), (4, 0.172)], heldout, cfg) == -np.inf  # not scored now
    assert alarms._whole_set_z([(0, 0.055), (8, 0.172)], heldout, AlarmConfig(heldout_n=96)) == -np.inf  # size unknown


def test_memorising_is_measured_on_the_training_sample_and_the_first_tries_only_hint():
    rng = np.random.default_rng(1)
    reward = list(np.linspace(0.2, 0.6, 20) + rng.normal(0, 0.03, 20))
    heldout = {0: 0.20, 4: 0.21, 8: 0.19, 12: 0.20, 16: 0.18, 20: 0.19}
    learned = {0: 0.20, 4: 0.28, 8: 0.36, 12: 0.44, 16: 0.5, 20: 0.6}  # the training prompts' answers
    assert set(replay(20, reward, heldout, learned)) == {"memorising"}
    flat = dict.fromkeys(heldout, 0.2)  # the checker does not follow on training prompts either: a gamed reward
    assert set(replay(20, reward, heldout, flat)) == {"checker_suspected"}


@pytest.mark.parametrize("first_try_rise, cause", [
    (0.0, "memorising the training prompts"),  # first tries stay low: the reward is the repeats'
    (0.6, "not memorising"),  # first tries score as the rest: a hole in the reward, or other held-out prompts
    (None, "a hole in the training reward"),  # no first tries seen
])
def test_checker_suspected_names_the_likelier_cause(first_try_rise, cause):
    stream = healthy()
    for i, m in enumerate(stream):
        if "heldout_accuracy" in m:
            m["heldout_accuracy"] = 0.1
        m["reward_first_try"] = float("nan") if first_try_rise is None else 0.1 + first_try_rise * i / STEPS
    monitor = AlarmMonitor(STEPS, CFG)
    monitor.observe(0, {"heldout_accuracy": 0.1})
    messages = {}
    for step, m in enumerate(stream, start=1):
        messages.update(monitor.observe(step, m)[1])
    assert cause in messages["checker_suspected"]


def test_a_final_evaluation_at_an_evaluations_step_replaces_it():
    # a run stopped (out of time, or by an alarm) at a step that had its evaluation evaluates again at the
    # end: the same greedy accuracy must not count twice in the fitted change or in the verdicts held
    monitor = AlarmMonitor(20, AlarmConfig(window=6))
    monitor.observe(0, {"heldout_subset_accuracy": 0.2, "train_sample_accuracy": 0.2})
    monitor.observe(4, {"reward_mean": 0.3, "heldout_subset_accuracy": 0.3, "train_sample_accuracy": 0.25})
    held = monitor.trend_held
    monitor.observe(4, {"heldout_subset_accuracy": 0.31, "train_sample_accuracy": 0.26}, final=True)
    assert monitor.heldout == [(0, 0.2), (4, 0.31)] and monitor.train == [(0, 0.2), (4, 0.26)]
    assert monitor.trend_held == held


# `grpo train --data subtract.jsonl --seed 1` (3,000 rows, uniform draws, 2026-12-04): the 32-prompt training
# sample read 0% -> 21.9% while the 96-prompt held-out subset swung 4.2%, 20.8%, 10.4%, 6.3%, 12.5%, 9.4%;
# memorising stopped the run at step 20, though the whole held-out set rose 5.9% -> 15.2% and 91% of its
# groups were first tries at their prompt (the training sample's prompts barely trained on)
SUBTRACT_REWARD = [0.0078, 0.0852, 0.043, 0.1071, 0.1771, 0.1591, 0.1683, 0.0625, 0.0547, 0.082, 0.0586, 0.1133,
                   0.0677, 0.043, 0.1094, 0.1761, 0.2368, 0.2448, 0.1974, 0.1172]
SUBTRACT_HELDOUT = {0: 0.0417, 4: 0.2083, 8: 0.1042, 12: 0.0625, 16: 0.125, 20: 0.0938}
SUBTRACT_TRAIN = {0: 0.0, 4: 0.0938, 8: 0.125, 12: 0.0312, 16: 0.1562, 20: 0.2188}
SUBTRACT_REPEATS = [0.0, 0.0, 0.0, 0.0, 0.042, 0.0, 0.038, 0.031, 0.031, 0.062, 0.156, 0.281, 0.042, 0.062, 0.208,
                    0.136, 0.211, 0.208, 0.053, 0.188]


def test_memorising_needs_repeats():
    measured = dict(steps=20, reward=SUBTRACT_REWARD, heldout=SUBTRACT_HELDOUT, train=SUBTRACT_TRAIN, window=10)
    assert "memorising" in replay(**measured)  # as the run raised it, before repeats were read
    assert "memorising" not in replay(**measured, repeats=SUBTRACT_REPEATS)  # 9% repeats: no verdict
    assert "memorising" in replay(**measured, repeats=[0.5] * 20)  # the same curves, half the groups repeats
    # the recent window's repeats, not the whole run's: none for 11 steps, then 40% (the run's mean 0.18)
    assert "memorising" in replay(**measured, repeats=[0.0] * 11 + [0.4] * 9)


def test_the_advice_on_memorising_names_uniform_draws_only_where_the_run_samples_at_the_frontier():
    rng = np.random.default_rng(1)
    reward = list(np.linspace(0.2, 0.6, 20) + rng.normal(0, 0.03, 20))
    heldout = [(0, 0.20), (4, 0.21), (8, 0.19), (12, 0.20), (16, 0.18), (20, 0.19)]
    learned = [(0, 0.20), (4, 0.28), (8, 0.36), (12, 0.44), (16, 0.5), (20, 0.6)]
    frontier = memorising(reward, heldout, learned, AlarmConfig(window=20))
    uniform = memorising(reward, heldout, learned, AlarmConfig(window=20, sampler="uniform"))
    assert "--sampler uniform" in frontier and "--sampler" not in uniform and "Try more training prompts" in uniform


def test_a_resumed_run_keeps_the_notes_said_before_its_checkpoint(monkeypatch):
    # the note said at step 2 travels in the monitor's state (a checkpoint's, through JSON): the resumed
    # run's log starts with it (grpo.run.step_metrics.open_log seeds its notes from ``said``) and says it no more
    import json

    monkeypatch.setattr(alarm_monitor, "slow_progress", lambda *args, **kw: "slow progress: x")
    monitor = AlarmMonitor(40, AlarmConfig(window=6))
    said = {}
    for step in (1, 2):
        said.update(monitor.observe(step, {"heldout_subset_accuracy": 0.2})[1])
    assert said == {"slow_progress": "slow progress: x"} == monitor.said
    resumed = AlarmMonitor(40, AlarmConfig(window=6))
    resumed.load_state(json.loads(json.dumps(monitor.state())))
    assert resumed.said == {"slow_progress": "slow progress: x"}
    assert resumed.observe(3, {"heldout_subset_accuracy": 0.2}, final=True)[1] == {}
    old = {k: v for k, v in monitor.state().items() if k != "said"}  # a checkpoint written before it was kept
    resumed.load_state(old)
    assert resumed.said == {}
