"""Alarms over the metric stream: no signal, checker suspected, stall, reward up while held-out
accuracy falls, suspected reward hacking, entropy collapse.

Advantages are relative within a group, so the objective never sees whether
typical reward is rising: a run can look busy while the policy stalls, and a
policy that games its checker looks like one that learns. These checks look
at absolute quantities instead. Each is a pure function of recent metric
values; ``AlarmMonitor`` keeps the history, runs them after every step and
reports an alarm when it turns on.

A trend is the least-squares line's change across the window (slope times
span), which is less noisy than last-minus-first. The thresholds assume
rewards and accuracies in [0, 1]; with B*G = 64 completions a step the
reward mean's noise is about 0.06, whose fitted change over 20 steps has a
standard deviation of about 0.045, hence windows of up to 20 steps.

The held-out accuracy the alarms watch is the small fixed subset that the
trainer evaluates every few steps (``eval_subset``, ``eval_every``).
``STOPPING`` alarms end the run early when ``early_stop`` is on: they say
that further steps will not raise held-out accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALARMS = ("no_signal", "checker_suspected", "stall", "reward_up_accuracy_down", "length_without_reward",
          "repetition_rising", "entropy_collapse")
STOPPING = ("no_signal", "checker_suspected", "stall", "reward_up_accuracy_down")
MEMORISED_GAP = 0.1  # mean reward above the first tries' by more than this: the reward is the repeats'
CONFIRM = 2  # a trend alarm stops the run once it has held at this many held-out evaluations in a row


@dataclass(frozen=True)
class AlarmConfig:
    """Thresholds; changes are measured across the last ``window`` steps."""

    window: int = 20  # steps a trend is measured over; no trend alarm before this many steps
    reward_flat: float = 0.05  # |change in raw reward| below this is flat
    accuracy_flat: float = 0.02  # |change in held-out accuracy| below this is flat
    adv_nonzero_min: float = 0.1  # "advantages non-zero": at least this fraction on average
    reward_rise: float = 0.05  # raw reward rising: change above this
    accuracy_drop: float = 0.03  # held-out accuracy falling: change below minus this
    length_rise: float = 0.2  # completion length growing: relative change above this (and >= 1 token)
    repetition_rise: float = 0.1  # repeated n-gram fraction rising: change above this
    entropy_floor: float = 0.05  # nats per token; below it early in training is a collapse
    early_frac: float = 0.25  # "early": the first quarter of the run
    no_signal_steps: int = 5  # steps in a row with too little signal before the no-signal alarm
    signal_min: float = 0.25  # "too little signal": under this share of the batch's groups vary
    checker_rise: float = 0.05  # checker suspected: raw reward rising by more than this (reward_flat) ...
    checker_follow: float = 0.15  # ... while held-out accuracy rises by less than this share of it


def fitted_change(values: Sequence[float]) -> float:
    """Change across the series of its least-squares line (NaNs dropped); 0 for fewer than 2 points."""
    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(y) < 2:
        return 0.0
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))


def rise_beyond_noise(values: Sequence[float], floor: float) -> float:
    """The least fitted change of ``values`` that counts as a rise: ``floor``, or twice the standard
    deviation a fitted change has when the series is only noise around its line (the residuals' spread),
    whichever is larger. Over a 10-step window a reward mean that jitters by 0.06 has fitted changes of
    about +-0.06 with no trend at all, so a plateau alone would pass a fixed 0.05."""
    y = np.asarray(values, dtype=float)
    y = y[np.isfinite(y)]
    n = len(y)
    if n < 3:
        return floor
    x = np.arange(n, dtype=float)
    residuals = y - np.polyval(np.polyfit(x, y, 1), x)
    sigma = float(np.sqrt((residuals**2).sum() / (n - 2)))
    sd_change = sigma * (n - 1) / math.sqrt(n * (n * n - 1) / 12)
    return max(floor, 2.0 * sd_change)


def stall(reward: Sequence[float], adv_nonzero: Sequence[float], accuracy: Sequence[float],
          cfg: AlarmConfig, first_try: Sequence[float] = ()) -> str | None:
    """Raw reward not rising beyond its noise (and held-out accuracy not rising, where measured) while
    advantages are non-zero: the updates have something to learn from and the run does not improve.
    A falling reward or accuracy is no better than a flat one. The message adds when the reward comes
    from prompts drawn before (see ``_divergence_cause``)."""
    if len(reward) < cfg.window:
        return None
    d_reward = fitted_change(reward)
    signal = float(np.nanmean(adv_nonzero)) if np.isfinite(adv_nonzero).any() else 0.0
    if d_reward > rise_beyond_noise(reward, cfg.reward_flat) or not signal >= cfg.adv_nonzero_min:
        return None
    if accuracy:  # held-out is watched: its trend over 3+ evaluations decides (one pair is mostly noise)
        measured = [a for a in accuracy if math.isfinite(a)]
        if len(measured) < 3 or not fitted_change(measured) < cfg.accuracy_flat:
            return None
    held = f", held-out accuracy {accuracy[0]:.1%} -> {accuracy[-1]:.1%}" if len(accuracy) >= 2 else ""
    tried = [x for x in first_try if math.isfinite(x)]
    memorised = len(tried) >= 3 and float(np.nanmean(reward)) - float(np.mean(tried)) > MEMORISED_GAP
    return (f"stall: raw reward changed {d_reward:+.3f} over {len(reward)} steps{held}, "
            f"while {signal:.0%} of advantages are non-zero" + (f". {_divergence_cause(reward, tried)}" if memorised else ""))


def no_signal(signal: Sequence[float], cfg: AlarmConfig) -> str | None:
    """Most of the batch uninformative (groups whose rewards are all equal) for several steps in a row."""
    recent = signal[-cfg.no_signal_steps :]
    if len(recent) < cfg.no_signal_steps or not all(s < cfg.signal_min for s in recent):
        return None
    return (f"no signal: in each of the last {len(recent)} steps under {cfg.signal_min:.0%} of the batch's groups "
            f"had rewards that differ (latest {recent[-1]:.0%}), so the updates learn next to nothing. The model "
            "solves almost none (or almost all) of these prompts: try a stronger model, easier data, a longer "
            "--max-new-tokens, or a reward with partial credit")


def checker_suspected(reward: Sequence[float], accuracy: Sequence[float], cfg: AlarmConfig,
                      first_try: Sequence[float] = ()) -> str | None:
    """Training reward rising while held-out accuracy (the task's checker) does not follow it; the
    message names the likelier cause from the reward on first tries at a prompt (``first_try``)."""
    if len(reward) < cfg.window or len(accuracy) < 3:
        return None
    # the held-out subset is noisy (128 prompts: +-4 points): the trend over 3+ evaluations, and the stop
    # needs the alarm to hold at two evaluations in a row (AlarmMonitor.stopping)
    d_reward, d_acc = fitted_change(reward), fitted_change(accuracy)
    follow = max(cfg.accuracy_flat, cfg.checker_follow * d_reward)
    if d_reward <= rise_beyond_noise(reward, cfg.checker_rise) or d_acc >= follow:
        return None
    return (f"checker suspected: raw training reward {d_reward:+.3f} over {len(reward)} steps while held-out "
            f"accuracy went {accuracy[0]:.1%} -> {accuracy[-1]:.1%}. {_divergence_cause(reward, first_try)}")


def _divergence_cause(reward: Sequence[float], first_try: Sequence[float]) -> str:
    """Why training reward runs ahead of held-out accuracy, read from the reward on first tries at a prompt.

    A hole in the reward pays on any prompt, first try or not; memorising pays only on prompts drawn
    before. So the window's mean reward on first tries is compared with its mean reward overall: levels,
    not trends, because a step holds only a few first tries and their trend is mostly noise.
    """
    tried = [x for x in first_try if math.isfinite(x)]
    if len(tried) < 3:
        return ("The policy is learning something the held-out checker does not reward: a hole in the training "
                "reward, answers memorised for the training prompts the sampler keeps returning, or only the "
                "sampler moving to easier prompts")
    first, overall = float(np.mean(tried)), float(np.nanmean(reward))
    if overall - first > MEMORISED_GAP:
        return (f"Its reward on prompts tried for the first time averaged {first:.2f} against {overall:.2f} "
                "overall: the reward comes from prompts drawn before, so the policy is memorising the training "
                "prompts the sampler keeps returning rather than learning the task. Try more training prompts, "
                "--sampler uniform, or a lower --lr")
    return (f"Its reward on prompts tried for the first time averaged {first:.2f}, as high as overall "
            f"({overall:.2f}), so it is not memorising: the training reward pays for something the held-out "
            "checker does not (audit it with grpo check-reward), or the held-out prompts differ from the "
            "training prompts")


def reward_up_accuracy_down(reward: Sequence[float], accuracy: Sequence[float], cfg: AlarmConfig,
                            first_try: Sequence[float] = ()) -> str | None:
    """Training reward rising while held-out accuracy (the task's checker) falls; the message names the
    likelier cause as checker_suspected does (a policy memorising its prompts also gets worse elsewhere)."""
    if len(reward) < cfg.window or len(accuracy) < 2:
        return None
    d_reward, d_acc = fitted_change(reward), accuracy[-1] - accuracy[0]
    if d_reward > rise_beyond_noise(reward, cfg.reward_rise) and d_acc < -cfg.accuracy_drop:
        return (f"reward up, held-out accuracy down: raw reward {d_reward:+.3f} over {len(reward)} steps "
                f"while held-out accuracy fell {accuracy[0]:.1%} -> {accuracy[-1]:.1%}. "
                f"{_divergence_cause(reward, first_try)}")
    return None


def length_without_reward(length: Sequence[float], reward: Sequence[float], cfg: AlarmConfig) -> str | None:
    """Completion length growing while raw reward does not."""
    if len(length) < cfg.window:
        return None
    d_len, d_reward = fitted_change(length), fitted_change(reward)
    base = max(float(np.nanmean(length[: max(1, len(length) // 4)])), 1.0)
    if d_len >= max(1.0, cfg.length_rise * base) and d_reward <= cfg.reward_rise:
        return (f"suspected reward hacking: completion length {d_len:+.1f} tokens ({d_len / base:+.0%}) "
                f"over {len(length)} steps while raw reward changed {d_reward:+.3f}")
    return None


def repetition_rising(repetition: Sequence[float], cfg: AlarmConfig) -> str | None:
    """The fraction of repeated n-grams in completions rising."""
    if len(repetition) < cfg.window:
        return None
    d_rep = fitted_change(repetition)
    if d_rep > cfg.repetition_rise:
        return f"suspected reward hacking: repeated n-gram fraction {d_rep:+.2f} over {len(repetition)} steps"
    return None


def entropy_collapse(entropy: Sequence[float], step: int, total_steps: int, cfg: AlarmConfig) -> str | None:
    """Policy entropy below the floor during the first ``early_frac`` of training."""
    recent = [e for e in entropy[-3:] if math.isfinite(e)]
    if not recent or step > cfg.early_frac * total_steps:
        return None
    level = float(np.mean(recent))
    if level < cfg.entropy_floor:
        return (f"entropy collapse: policy entropy {level:.3f} nats/token at step {step} of {total_steps} "
                f"(floor {cfg.entropy_floor})")
    return None


class AlarmMonitor:
    """Feeds each step's metrics to the checks; flags every alarm, reports each when it turns on."""

    def __init__(self, total_steps: int, config: AlarmConfig | None = None, *, watch_heldout: bool = True) -> None:
        """``watch_heldout=False``: the held-out checker cannot score these rows (they have no answer, as
        with a TRL length reward on prompts alone), so the alarms that compare with it stay off."""
        self.total_steps = total_steps
        self.watch_heldout = watch_heldout
        self.config = config or AlarmConfig()
        self.series: dict[str, list[float]] = {}
        self.heldout: list[tuple[int, float]] = []  # (step, accuracy)
        self.active: dict[str, bool] = dict.fromkeys(ALARMS, False)
        self.messages: dict[str, str] = {}
        self.trend_held = 0  # held-out evaluations in a row at which some stopping trend alarm was on

    def observe(self, step: int, metrics: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
        """Record a step's metrics; return the ``alarm/<name>`` flags (1.0 on) and newly raised warnings."""
        for key in ("reward_mean", "adv_nonzero_frac", "completion_len", "repeat_ngram_frac", "entropy",
                    "signal_frac", "reward_first_try"):
            if key in metrics:
                value = metrics[key]
                self.series.setdefault(key, []).append(float("nan") if value is None else float(value))
        watched = metrics.get("heldout_subset_accuracy", metrics.get("heldout_accuracy")) if self.watch_heldout else None
        if watched is not None:
            self.heldout.append((step, float(watched)))
        messages = self._check(step)
        warnings = {name: msg for name, msg in messages.items() if msg and not self.active[name]}
        self.messages = {name: msg for name, msg in messages.items() if msg}
        trend = any(messages[name] for name in STOPPING if name != "no_signal")
        self.trend_held = 0 if not trend else self.trend_held + (watched is not None)
        self.active = {name: msg is not None for name, msg in messages.items()}
        return {f"alarm/{name}": float(on) for name, on in self.active.items()}, warnings

    def state(self) -> dict:
        """What a checkpoint keeps, so that a resumed run's alarms see the steps before it."""
        return {"series": self.series, "heldout": self.heldout, "active": self.active, "trend_held": self.trend_held}

    def load_state(self, state: dict | None) -> None:
        if state:
            self.series = {k: list(v) for k, v in state["series"].items()}
            self.heldout = [tuple(x) for x in state["heldout"]]
            self.active.update(state["active"])
            self.trend_held = int(state.get("trend_held", 0))  # absent from older checkpoints

    def stopping(self) -> str | None:
        """The message of the first active alarm that means the run will not learn, if any.

        no_signal counts its own steps; trend alarms must have held at CONFIRM held-out evaluations
        in a row, so one noisy evaluation does not end a run that is learning. They may take turns
        (a flat reward raises stall, a step later a rising one raises checker_suspected): any of them
        on counts, and the message is the first one on now.
        """
        if "no_signal" in self.messages:
            return self.messages["no_signal"]
        if self.trend_held >= CONFIRM:
            return next((self.messages[name] for name in STOPPING if name in self.messages), None)
        return None

    def _recent(self, key: str) -> list[float]:
        return self.series.get(key, [])[-self.config.window :]

    def _heldout_window(self, step: int) -> list[float]:
        """Held-out accuracies since the window began, led by the last one measured before it."""
        start = step - self.config.window
        before = [a for s, a in self.heldout if s <= start]
        inside = [a for s, a in self.heldout if s > start]
        return ([before[-1]] if before else []) + inside

    def _check(self, step: int) -> dict[str, str | None]:
        cfg = self.config
        reward, accuracy = self._recent("reward_mean"), self._heldout_window(step)
        return {
            "no_signal": no_signal(self.series.get("signal_frac", []), cfg),
            "checker_suspected": checker_suspected(reward, accuracy, cfg, self._recent("reward_first_try")),
            "stall": stall(reward, self._recent("adv_nonzero_frac"), accuracy, cfg, self._recent("reward_first_try")),
            "reward_up_accuracy_down": reward_up_accuracy_down(reward, accuracy, cfg, self._recent("reward_first_try")),
            "length_without_reward": length_without_reward(self._recent("completion_len"), reward, cfg),
            "repetition_rising": repetition_rising(self._recent("repeat_ngram_frac"), cfg),
            "entropy_collapse": entropy_collapse(self._recent("entropy"), step, self.total_steps, cfg),
        }
