"""The alarms' monitor: keeps a run's metric series and held-out accuracies, runs the checks of
grpo/observe/alarms.py after every step, raises the verdicts on learning once they hold, and keeps its state
through a checkpoint."""

from __future__ import annotations

from grpo.learning.teacher.alarm import divergence_rising
from grpo.observe.alarms import (
    ALARMS,
    CONFIRM,
    STOPPING,
    TRENDS,
    WARN_AFTER,
    AlarmConfig,
    checker_suspected,
    entropy_collapse,
    length_without_reward,
    memorising,
    no_signal,
    repetition_rising,
    slow_progress,
    stall,
)


def _put(series: list[tuple[int, float]], step: int, value: float) -> None:
    """Add a measurement; one at the step of the last replaces it (the final evaluation of a run that stopped
    at an evaluation's step), so that no step counts twice."""
    if series and series[-1][0] == step:
        series[-1] = (step, value)
    else:
        series.append((step, value))


class AlarmMonitor:
    """Feeds each step's metrics to the checks; flags every alarm, reports each when it turns on."""

    def __init__(self, total_steps: int, config: AlarmConfig | None = None, *, watch_heldout: bool = True,
                 watch_reward: bool = True) -> None:
        """``watch_heldout=False``: the held-out checker cannot score these rows (they have no answer, as
        with a TRL length reward on prompts alone), so the alarms that compare with it stay off.
        ``watch_reward=False`` (--rewards none): no reward to rise, so length_without_reward stays off."""
        self.total_steps = total_steps
        self.watch_heldout, self.watch_reward = watch_heldout, watch_reward
        self.config = config or AlarmConfig()
        self.series: dict[str, list[float]] = {}
        self.heldout: list[tuple[int, float]] = []  # (step, accuracy on the held-out subset)
        self.train: list[tuple[int, float]] = []  # (step, accuracy on the fixed training sample)
        self.full: list[tuple[int, float]] = []  # (step, accuracy on the whole held-out set): start and end
        self.active: dict[str, bool] = dict.fromkeys(ALARMS, False)
        self.messages: dict[str, str] = {}
        self.verdicts: dict[str, str | None] = {}  # the trend alarms' verdicts at the latest evaluation
        self.trend_held = 0  # held-out evaluations in a row at which some trend verdict was on
        self.note: str | None = None  # slow_progress's verdict at the latest evaluation
        self.note_held = 0  # held-out evaluations in a row at which it was on
        self.noted = False  # said already (once a run)
        self.said: dict[str, str] = {}  # the notes said, kept through a checkpoint for summary.json

    def observe(self, step: int, metrics: dict[str, float], *, final: bool = False
                ) -> tuple[dict[str, float], dict[str, str]]:
        """Record a step's metrics; return the ``alarm/<name>`` flags (1.0 on) and newly raised warnings, a
        note among them by its name (NOTES: no flag of its own, no part of a stop).
        ``final``: the run's last evaluation, whose verdicts are raised without waiting for another."""
        for key in ("reward_mean", "adv_nonzero_frac", "completion_len", "repeat_ngram_frac", "entropy",
                    "signal_frac", "reward_first_try", "accuracy", "repeat_frac", "teacher_kl"):
            if key in metrics:
                value = metrics[key]
                self.series.setdefault(key, []).append(float("nan") if value is None else float(value))
        watched = metrics.get("heldout_subset_accuracy", metrics.get("heldout_accuracy")) if self.watch_heldout else None
        new = watched is not None and not (self.heldout and self.heldout[-1][0] == step)
        if watched is not None:
            _put(self.heldout, step, float(watched))
            if metrics.get("train_sample_accuracy") is not None:
                _put(self.train, step, float(metrics["train_sample_accuracy"]))
            if metrics.get("heldout_accuracy") is not None:
                _put(self.full, step, float(metrics["heldout_accuracy"]))
        messages = self._check(step)
        if watched is None:  # the verdicts on learning change only when accuracy is measured
            messages.update({name: self.verdicts.get(name) for name in TRENDS})
        self.verdicts = {name: messages[name] for name in TRENDS}
        trend = any(self.verdicts.values())
        self.trend_held = 0 if not trend else self.trend_held + new
        if self.trend_held < WARN_AFTER and not final:  # raised once held at WARN_AFTER evaluations, or at the end
            messages.update(dict.fromkeys(TRENDS))
        warnings = {name: msg for name, msg in messages.items() if msg and not self.active[name]}
        self.messages = {name: msg for name, msg in messages.items() if msg}
        self.active = {name: msg is not None for name, msg in messages.items()}
        return {f"alarm/{name}": float(on) for name, on in self.active.items()}, {**warnings, **self._notes(new, final)}

    def _notes(self, new: bool, final: bool) -> dict[str, str]:
        """slow_progress, taken at each held-out evaluation (``new``) and said once, as the trend verdicts
        are raised: once on at WARN_AFTER evaluations in a row, or at the final one."""
        if new:
            self.note = slow_progress(self.series.get("reward_mean", []), self.series.get("adv_nonzero_frac", []),
                                      self.heldout, self.train, self.config, self.full)
            self.note_held = self.note_held + 1 if self.note else 0
        if self.note is None or self.noted or (self.note_held < WARN_AFTER and not final):
            return {}
        self.noted, self.said["slow_progress"] = True, self.note
        return {"slow_progress": self.note}

    def state(self) -> dict:
        """What a checkpoint keeps, so that a resumed run's alarms see the steps before it."""
        return {"series": self.series, "heldout": self.heldout, "train": self.train, "full": self.full,
                "active": self.active,
                "verdicts": self.verdicts, "trend_held": self.trend_held,
                "note": self.note, "note_held": self.note_held, "noted": self.noted, "said": self.said}

    def load_state(self, state: dict | None) -> None:
        if state:
            self.series = {k: list(v) for k, v in state["series"].items()}
            self.heldout = [tuple(x) for x in state["heldout"]]
            self.train = [tuple(x) for x in state.get("train", [])]  # absent from older checkpoints
            self.full = [tuple(x) for x in state.get("full", [])]  # absent from older checkpoints
            self.active.update({k: v for k, v in state["active"].items() if k in self.active})
            self.verdicts = dict(state.get("verdicts", {}))  # absent from older checkpoints
            self.trend_held = int(state.get("trend_held", 0))
            self.note, self.note_held = state.get("note"), int(state.get("note_held", 0))  # absent from older ones
            self.noted, self.said = bool(state.get("noted", False)), dict(state.get("said", {}))

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

    def _check(self, step: int) -> dict[str, str | None]:
        cfg, series = self.config, self.series
        reward, first_try = series.get("reward_mean", []), series.get("reward_first_try", [])
        accuracy = series.get("accuracy", [])
        recent_reward = self._recent("reward_mean")
        return {
            "no_signal": no_signal(series.get("signal_frac", []), cfg),
            "checker_suspected": checker_suspected(reward, self.heldout, self.train, cfg, first_try, accuracy),
            "stall": stall(reward, series.get("adv_nonzero_frac", []), self.heldout, self.train, cfg, first_try,
                           self.full),
            "memorising": memorising(reward, self.heldout, self.train, cfg, first_try, accuracy,
                                     self._recent("repeat_frac")),
            "length_without_reward": length_without_reward(self._recent("completion_len"), recent_reward, cfg)
            if self.watch_reward else None,
            "repetition_rising": repetition_rising(self._recent("repeat_ngram_frac"), cfg),
            "entropy_collapse": entropy_collapse(self._recent("entropy"), step, self.total_steps, cfg),
            "divergence_rising": divergence_rising(series.get("teacher_kl", []), cfg.window),
        }
