"""Each alarm on synthetic metric streams that should, and should not, trigger it."""

import numpy as np
import pytest

from grpo.alarms import AlarmConfig, AlarmMonitor, fitted_change, reward_up_accuracy_down

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


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_run_raises_nothing(seed):
    assert run(healthy(seed)) == {}


def test_stall_fires_when_reward_and_accuracy_are_flat_with_nonzero_advantages():
    flat = 0.3 + noise(1, 0.02)
    stream = [{**m, "heldout_accuracy": 0.2} if "heldout_accuracy" in m else m
              for m in with_changes(healthy(), reward_mean=flat)]
    first = run(stream, heldout_start=0.2)
    assert first.get("stall") == CFG.window
    assert set(first) == {"stall"}


def test_stall_stays_quiet_without_learning_signal_or_while_accuracy_moves():
    flat = 0.3 + noise(1, 0.02)
    silent = with_changes(healthy(), reward_mean=flat, adv_nonzero_frac=np.zeros(STEPS))
    assert "stall" not in run(silent)  # no non-zero advantages: nothing to learn from, not a stall
    moving = with_changes(healthy(), reward_mean=flat)  # held-out accuracy still climbs
    assert "stall" not in run(moving)


def test_reward_up_while_heldout_accuracy_falls():
    falling = healthy()  # reward 0.1 -> 0.7
    for i, m in enumerate(falling):
        if "heldout_accuracy" in m:
            m["heldout_accuracy"] = 0.5 - 0.4 * (i + 1) / STEPS
    first = run(falling, heldout_start=0.5)
    assert "reward_up_accuracy_down" in first
    assert "stall" not in first
    # the same reward with accuracy rising is the healthy run
    assert "reward_up_accuracy_down" not in run(healthy())


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


def test_checker_suspected_fires_when_reward_rises_and_heldout_does_not_follow():
    stream = healthy()
    for m in stream:
        if "heldout_accuracy" in m:
            m["heldout_accuracy"] = 0.1 + 0.01 * (m["reward_mean"] > 0.4)  # +1 point while reward +0.6
    first = run(stream)
    assert "checker_suspected" in first and first["checker_suspected"] <= CFG.window + 5


@pytest.mark.parametrize("first_try_rise, cause", [
    (0.0, "memorising the training prompts"),  # first tries stay low: the reward is the repeats'
    (0.6, "not memorising"),  # first tries score as the rest: a hole in the reward, or other held-out prompts
    (None, "a hole in the training reward, answers memorised"),  # no first tries seen: both said
])
def test_checker_suspected_names_the_likelier_cause(first_try_rise, cause):
    stream = healthy()
    for i, m in enumerate(stream):
        if "heldout_accuracy" in m:
            m["heldout_accuracy"] = 0.1
        m["reward_first_try"] = float("nan") if first_try_rise is None else 0.1 + first_try_rise * i / STEPS
    monitor = AlarmMonitor(STEPS, CFG)
    messages = {}
    for step, m in enumerate(stream, start=1):
        messages.update(monitor.observe(step, m)[1])
    assert cause in messages["checker_suspected"]


def test_checker_suspected_stays_quiet_when_heldout_follows_a_slower_rise():
    # reward +0.6 over the run, held-out +0.15 (a quarter of it): slow learning, not a gamed checker
    stream = healthy()
    for m in stream:
        if "heldout_accuracy" in m:
            m["heldout_accuracy"] = 0.3 + 0.15 * stream.index(m) / STEPS
    assert "checker_suspected" not in run(stream, heldout_start=0.3)


def noisy_learning_run(seed: int, steps: int = 20, gain: float = 0.25, rise: float = 0.3) -> AlarmMonitor:
    """A run that learns slowly, seen as the trainer sees it: reward noise 0.06 a step, held-out accuracy
    on a 128-prompt subset (binomial noise) every 2 steps, the automatic window of half the run."""
    rng = np.random.default_rng(seed)
    monitor = AlarmMonitor(steps, AlarmConfig(window=max(6, steps // 2)))
    monitor.observe(0, {"heldout_subset_accuracy": rng.binomial(128, 0.1) / 128})
    for step in range(1, steps + 1):
        m = {"reward_mean": 0.1 + rise * step / steps + rng.normal(0, 0.06), "adv_nonzero_frac": 0.6,
             "signal_frac": 0.8, "completion_len": 10.0, "repeat_ngram_frac": 0.0, "entropy": 0.5}
        if step % 2 == 0:
            m["heldout_subset_accuracy"] = rng.binomial(128, 0.1 + gain * step / steps) / 128
        monitor.observe(step, m)
        if monitor.stopping():
            return monitor
    return monitor


def test_a_noisy_run_that_learns_is_not_stopped():
    # held-out rises 25 points while reward rises 30: learning, however noisy its measurement
    stopped = [seed for seed in range(40) if noisy_learning_run(seed).stopping()]
    assert len(stopped) <= 2, stopped


@pytest.mark.parametrize(("gain", "least", "most"), [(0.25, 0, 2), (0.0, 32, 40)])
def test_with_the_reward_held_flat_the_stall_reads_the_heldout_trend(gain, least, most):
    # the frontier sampler holds the training reward near its frontier, so the reward's trend says
    # little and the stall decides on held-out accuracy alone: a run that gains 25 points is not
    # stopped, one that gains none is (one that gains 10 in 20 steps is stopped about a third of the time)
    stopped = [seed for seed in range(40) if noisy_learning_run(seed, gain=gain, rise=0.0).stopping()]
    assert least <= len(stopped) <= most, stopped
    stalls = [seed for seed in stopped if "stall" in noisy_learning_run(seed, gain=gain, rise=0.0).stopping()]
    assert len(stalls) >= 0.9 * len(stopped)  # the rest: a noise rise of the reward read as checker_suspected


def test_a_noisy_run_whose_heldout_stays_flat_is_stopped():
    # the same reward rise with held-out accuracy flat: the checker-suspected alarm ends most such runs
    # (its +0.15 across a 10-step window is 2.5 noise sd; a rise must exceed 2 sd, so about a third pass)
    stopped = [seed for seed in range(40) if noisy_learning_run(seed, gain=0.0).stopping()]
    assert len(stopped) >= 24, stopped


def test_a_plateau_with_noisy_heldout_raises_only_the_stall_at_its_end():
    # the last 10 steps of a default `add` run (measured): reward +0.057 by its fitted line, within the
    # noise of 10 steps (sd of such a change 0.037); held-out subset 57.8% -> 57.0% -> 53.9% (128 prompts:
    # sd 4.4 points each). A fixed 0.05 threshold raised checker_suspected and reward_up_accuracy_down here
    reward = [0.8125, 0.9196, 0.8080, 0.8711, 0.8945, 0.8477, 0.8973, 0.8672, 0.8828, 0.9219]
    monitor = AlarmMonitor(20, AlarmConfig(window=10))
    monitor.observe(0, {"heldout_subset_accuracy": 0.141})
    raised = {}
    for step in range(1, 21):
        m = {"reward_mean": ([0.3, 0.45, 0.55, 0.6, 0.7, 0.68, 0.83, 0.71, 0.75, 0.88] + reward)[step - 1],
             "adv_nonzero_frac": 0.2, "signal_frac": 0.5, "completion_len": 11.5, "repeat_ngram_frac": 0.0,
             "entropy": 0.06}
        m.update({5: {"heldout_subset_accuracy": 0.469}, 10: {"heldout_subset_accuracy": 0.578},
                  15: {"heldout_subset_accuracy": 0.570}, 20: {"heldout_subset_accuracy": 0.539}}.get(step, {}))
        for name in monitor.observe(step, m)[1]:
            raised.setdefault(name, step)
    # reward flat and held-out not rising over the last 10 steps: the run has stopped improving, and a
    # longer run would stop here with the stall; no alarm blames the checker
    assert raised == {"stall": 20}, raised
    fixed = AlarmMonitor(20, AlarmConfig(window=10))
    assert fixed.config.checker_rise < 0.057  # the rise alone clears the old fixed threshold


@pytest.mark.parametrize("first_try, memorising", [(0.17, True), (0.7, False)])
def test_a_stall_on_repeated_prompts_says_the_reward_comes_from_them(first_try, memorising):
    # a subtraction file (measured): training reward flat near 0.73 on prompts the sampler returns, 0.17 on
    # first tries, held-out accuracy flat near 10%: the stall's message says where the reward comes from
    rng = np.random.default_rng(0)
    monitor = AlarmMonitor(30, AlarmConfig(window=6))
    monitor.observe(0, {"heldout_subset_accuracy": 0.1})
    messages = {}
    for step in range(1, 31):
        m = {"reward_mean": 0.73 + rng.normal(0, 0.02), "adv_nonzero_frac": 0.8, "signal_frac": 0.7,
             "completion_len": 12.0, "repeat_ngram_frac": 0.0, "entropy": 0.5,
             "reward_first_try": first_try + rng.normal(0, 0.05)}
        if step % 3 == 0:
            m["heldout_subset_accuracy"] = 0.1
        messages.update(monitor.observe(step, m)[1])
    assert messages["stall"].startswith("stall: ")
    assert ("memorising" in messages["stall"]) == memorising


def test_reward_up_accuracy_down_names_the_cause_from_first_tries():
    reward = list(np.linspace(0.2, 0.8, CFG.window))
    accuracy = [0.45, 0.40, 0.35]
    memorising = reward_up_accuracy_down(reward, accuracy, CFG, first_try=[0.2] * CFG.window)
    assert memorising is not None and "memorising the training prompts" in memorising
    hole = reward_up_accuracy_down(reward, accuracy, CFG, first_try=reward)
    assert hole is not None and "not memorising" in hole and "grpo check-reward" in hole
    assert reward_up_accuracy_down(reward, [0.35, 0.40, 0.45], CFG, first_try=reward) is None


def test_trend_alarms_that_take_turns_count_together_toward_the_stop(monkeypatch):
    # measured on a multiplication file: stall, then checker_suspected, then stall again, each on for
    # fewer than two evaluations; the run learned nothing and must stop, with the alarm that is on now
    from grpo.alarms import ALARMS

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
