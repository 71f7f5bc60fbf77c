"""An adapted sampling temperature (temperature_target): the rule by hand, a tiny run that follows it, and a
resumed run that samples at the temperature the stopped one reached."""

from __future__ import annotations

import math

import pytest
from tiny_run import metrics_lines, tiny_trainer

from grpo.config import ConfigError, TrainConfig
from grpo.math.algorithm import TEMPERATURE_RANGE, adapted_temperature


def test_adapted_temperature_by_hand():
    # T (target / H)^(1/4): an entropy 16 times the target halves T, a sixteenth of it doubles T
    assert adapted_temperature(0.7, 0.3 * 16, 0.3) == pytest.approx(0.35)
    assert adapted_temperature(0.45, 0.3 / 16, 0.3) == pytest.approx(0.9)
    assert adapted_temperature(0.7, 0.3, 0.3) == pytest.approx(0.7)  # on target: unchanged
    assert adapted_temperature(0.7, 0.3 / 16, 0.3) == TEMPERATURE_RANGE[1] == 1.0  # 1.4, clipped
    assert adapted_temperature(0.4, 0.3 * 16, 0.3) == TEMPERATURE_RANGE[0] == 0.3  # 0.2, clipped
    for unknown in (math.nan, 0.0, math.inf):  # nothing trained, or no finite measure: T stays
        assert adapted_temperature(0.7, unknown, 0.3) == 0.7


def test_temperature_target_is_checked():
    with pytest.raises(ConfigError, match="temperature_target must be >= 0"):
        TrainConfig(temperature_target=-0.1)
    with pytest.raises(ConfigError, match="async_lag"):
        TrainConfig(temperature_target=0.3, async_lag=1)


@pytest.mark.model
def test_each_step_samples_at_the_temperature_the_step_before_set(tmp_path):
    trainer = tiny_trainer(steps=4, temperature=1.0, temperature_target=1.0, seed=1)
    trainer.train(tmp_path / "run")
    steps = [row for row in metrics_lines(tmp_path / "run") if "temperature" in row]
    assert [row["step"] for row in steps] == [1, 2, 3, 4] and steps[0]["temperature"] == 1.0
    for before, after in zip(steps[:-1], steps[1:], strict=True):  # metrics.jsonl writes a NaN entropy (nothing trained) as null
        entropy = math.nan if before["entropy"] is None else before["entropy"]
        assert after["temperature"] == pytest.approx(adapted_temperature(before["temperature"], entropy, 1.0))
    assert 0.3 < steps[-1]["temperature"] < 0.9  # the tiny model's entropy is above 1 nat: T falls, unclipped
    # the update trains at the temperature the sampler used: its log-probs are the sampler's (an update left at
    # the old temperature would differ by the change of scale, tenths of a nat)
    assert all(row["sampler_logp_diff_max"] < 1e-3 for row in steps), [row["sampler_logp_diff_max"] for row in steps]
    # the adapted T is the run's state: the configuration stays the resolved --temperature (the trainer used to
    # write each step's T into it, and the checkpoints' configuration held the last one: 0.68 here)
    last = math.nan if steps[-1]["entropy"] is None else steps[-1]["entropy"]
    assert trainer.config.temperature == 1.0
    assert trainer.temperature.value == pytest.approx(adapted_temperature(steps[-1]["temperature"], last, 1.0))
    from grpo.run.checkpoint import latest, read_meta

    assert read_meta(latest(tmp_path / "run"))["config"]["temperature"] == 1.0


@pytest.mark.model
def test_a_resumed_run_samples_at_the_temperature_it_reached(tmp_path):
    kw = dict(temperature=1.0, temperature_target=0.05, seed=1)
    tiny_trainer(steps=4, **kw).train(tmp_path / "straight")
    tiny_trainer(steps=2, **kw).train(tmp_path / "split")
    resumed = tiny_trainer(steps=4, **kw)
    resumed.train(tmp_path / "split", resume=True)
    assert metrics_lines(tmp_path / "straight") == metrics_lines(tmp_path / "split")
    assert resumed.config.temperature == 1.0 and resumed.temperature.value < 1.0  # the state restored, not the config
    assert resumed.learner.temperature is resumed.sampling.generation.temperature is resumed.temperature
