"""TRL GRPOConfig files read as grpo options: renames, TRL's defaults, conversions, errors."""

import pytest

from grpo.config import ConfigError, TrainConfig
from grpo.trl_config import IGNORED, NEUTRAL, RENAMED, TRL_DEFAULTS, translate


def config(values: dict) -> tuple[TrainConfig, list[str]]:
    options, ignored = translate(values)
    return TrainConfig.from_dict(options), ignored


def test_trl_keys_map_to_grpo_options():
    cfg, ignored = config({
        "learning_rate": "2e-6",  # YAML reads 1e-6 without a dot as text; TRL's parser takes it
        "num_generations": 4, "max_completion_length": 32, "beta": 0.04, "epsilon": 0.1, "epsilon_high": 0.3,
        "loss_type": "grpo", "scale_rewards": False, "num_iterations": 2, "temperature": 0.9, "top_p": 0.95,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 7, "seed": 3,
        "output_dir": "out", "logging_steps": 1, "save_steps": 5, "use_peft": True, "lora_r": 8,
        "importance_sampling_level": "sequence", "bf16": True, "push_to_hub": False, "gradient_checkpointing": True,
    })
    assert (cfg.lr, cfg.group_size, cfg.max_new_tokens, cfg.beta) == (2e-6, 4, 32, 0.04)
    assert (cfg.clip_low, cfg.clip_high, cfg.aggregate, cfg.scale, cfg.epochs) == (0.1, 0.3, "sequence", "none", 2)
    # TRL's 7 optimiser steps at num_iterations 2 are 4 generation steps of 2 passes each here
    assert (cfg.temperature, cfg.top_p, cfg.steps, cfg.seed, cfg.output) == (0.9, 0.95, 4, 3, "out")
    assert (cfg.batch_size, cfg.prompts_per_step) == (8, 2)  # 4 per device x 2 accumulation steps = N
    assert (cfg.log_every, cfg.save_every, cfg.lora_rank, cfg.lora_alpha) == (1, 3, 8, 32.0)
    assert cfg.ratio_level == "sequence" and cfg.gradient_checkpointing
    assert ignored == ["bf16", "push_to_hub"]


def test_a_trl_config_takes_trl_defaults_for_what_it_leaves_out():
    cfg, _ = config({"output_dir": "out", "max_steps": 3})
    assert (cfg.lr, cfg.temperature, cfg.max_new_tokens, cfg.group_size, cfg.seed) == (1e-6, 1.0, 256, 8, 42)
    assert cfg.clip_high == cfg.clip_low == 0.2  # TRL: epsilon_high defaults to epsilon
    assert (cfg.filter_groups, cfg.sampler, cfg.aggregate) == (False, "uniform", "token")  # loss_type dapo
    assert cfg.gradient_checkpointing  # GRPOConfig turns it on by default


def test_epsilon_alone_sets_both_clip_bounds():
    cfg, _ = config({"epsilon": 0.15, "max_steps": 2})
    assert cfg.clip_low == cfg.clip_high == 0.15


def test_a_grpo_config_is_left_alone():
    cfg, ignored = config({"lr": 1e-5, "steps": 4})
    assert (cfg.lr, cfg.steps, cfg.temperature, cfg.filter_groups) == (1e-5, 4, 0.7, True)
    assert ignored == []


@pytest.mark.parametrize("values, message", [
    ({"loss_type": "luspo"}, "loss_type 'luspo' is not supported by grpo (it supports dapo, grpo, dr_grpo, cispo, sapo)"),
        ({"loss_type": "cispo"}, "loss_type cispo: TRL caps the weight at epsilon_high itself; give epsilon_high above 1"),
    ({"learning_rate": "fast"}, "learning_rate must be of type float, got 'fast'"),
    ({"num_generations": 2.5}, "num_generations must be of type int, got 2.5"),
    ({"per_device_train_batch_size": "four"}, "per_device_train_batch_size must be a positive int, got 'four'"),
    ({"per_device_train_batch_size": 6, "num_generations": 4}, "(6) must be a multiple of num_generations (4)"),
    ({"num_train_epochs": 3}, "num_train_epochs: grpo counts steps, not epochs; set max_steps instead"),
    ({"learning_rate": 1e-6, "lr": 1e-5}, "config gives both 'learning_rate' (TRL) and 'lr' (grpo): give one"),
    ({"lerning_rate": 1e-6}, "unknown config key 'lerning_rate' (did you mean 'learning_rate'?)"),
    ({"max_steps": 3, "grop_size": 4}, "unknown config key 'grop_size' (did you mean 'group_size'?)"),
    ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type: 'cosine' would change results"),
])
def test_bad_trl_values_are_errors_that_name_the_trl_key(values, message):
    with pytest.raises(ConfigError) as err:
        config(values)
    assert message in str(err.value)


def test_the_vocabularies_are_disjoint_where_they_must_be():
    assert not set(RENAMED) & IGNORED
    assert not set(NEUTRAL) & IGNORED
    assert set(RENAMED.values()) | set(TRL_DEFAULTS) <= {f for f in TrainConfig.__dataclass_fields__}


def test_the_readme_trl_config_reads_with_its_warning():
    import re
    from pathlib import Path

    import yaml

    readme = (Path(__file__).resolve().parents[1] / "docs" / "from-trl-verl.md").read_text()
    block = re.search(r"```yaml\n(# trl_grpo\.yaml.*?)```", readme, re.DOTALL).group(1)
    cfg, ignored = config(yaml.safe_load(block))
    assert (cfg.output, cfg.steps, cfg.batch_size, cfg.group_size, cfg.lr) == ("Qwen2-0.5B-GRPO", 100, 8, 8, 1e-6)
    assert ignored == ["bf16"]


def test_null_keys_are_unset_and_a_stray_ignored_key_keeps_grpo_defaults():
    cfg, _ = config({"learning_rate": 1e-5, "epsilon": 0.15, "epsilon_high": None, "top_k": None, "max_steps": -1,
                     "num_generations": 4, "per_device_train_batch_size": 8})
    assert cfg.clip_high == 0.15  # TRL: epsilon_high defaults to epsilon, also when written as null
    assert cfg.top_k == 0 and cfg.steps == TrainConfig().steps
    grpo_cfg, ignored = config({"lr": 3e-5, "prompts_per_step": 8, "bf16": True})
    assert ignored == ["bf16"]
    assert (grpo_cfg.temperature, grpo_cfg.filter_groups, grpo_cfg.sampler) == (0.7, True, "")  # the task's sampler


def test_mask_truncated_completions_maps_to_mask_truncated():
    cfg, _ = config({"learning_rate": 1e-5, "mask_truncated_completions": True})
    assert cfg.mask_truncated is True


def test_use_vllm_selects_the_vllm_engine_and_its_importance_sampling():
    cfg, ignored = config({"max_steps": 3, "use_vllm": True, "vllm_mode": "colocate",
                           "vllm_gpu_memory_utilization": 0.3, "vllm_importance_sampling_mode": "token_truncate",
                           "vllm_importance_sampling_clip_max": 2.5})
    assert (cfg.engine, cfg.vllm_memory, cfg.tis_level, cfg.tis_cap) == ("vllm", 0.3, "token", 2.5)
    assert ignored == ["vllm_mode"]  # where vLLM runs changes no result
    cfg, _ = config({"max_steps": 3, "use_vllm": True})  # TRL's default: sequence_mask at a cap of 3
    assert (cfg.engine, cfg.tis_mode, cfg.tis_level, cfg.tis_cap, cfg.vllm_memory) == (
        "vllm", "mask", "sequence_ratio", 3.0, 0.3)
    assert cfg.vllm_sleep is False  # TRL's vllm_enable_sleep_mode default
    cfg, _ = config({"use_vllm": True, "vllm_enable_sleep_mode": True})
    assert cfg.vllm_sleep is True
    cfg, _ = config({"use_vllm": True, "tis_level": "sequence", "tis_cap": 5.0, "vllm_importance_sampling_clip_min": 0})
    assert (cfg.engine, cfg.tis_mode, cfg.tis_level, cfg.tis_cap) == ("vllm", "truncate", "sequence", 5.0)  # grpo's own
    cfg, _ = config({"max_steps": 3, "use_vllm": True, "vllm_importance_sampling_correction": False})
    assert cfg.tis_cap == 0.0
    cfg, ignored = config({"max_steps": 3, "vllm_gpu_memory_utilization": 0.5})  # without use_vllm: no meaning
    assert (cfg.engine, cfg.vllm_memory) == ("own", TrainConfig().vllm_memory)
    assert ignored == ["vllm_gpu_memory_utilization"]


@pytest.mark.parametrize("values", [{"use_vllm": False, "lr": 1e-3}, {"vllm_gpu_memory_utilization": 0.3, "steps": 5}])
def test_vllm_keys_without_use_vllm_leave_a_grpo_config_alone(values):
    cfg, ignored = config(values)
    assert (cfg.group_size, cfg.sampler, cfg.engine) == (TrainConfig().group_size, "", "own")  # grpo's
    assert ignored == [k for k in values if k not in ("lr", "steps")]


@pytest.mark.parametrize("mode, clip_min, expected", [
    ("token_truncate", None, ("truncate", "token", 0.0)),
    ("token_mask", 0.5, ("mask", "token", 0.5)),  # IcePop's [0.5, 5] with clip_max 5
    ("sequence_truncate", 0, ("truncate", "sequence_ratio", 0.0)),
    ("sequence_mask", 0.25, ("mask", "sequence_ratio", 0.25)),
])
def test_each_trl_importance_sampling_mode_is_a_tis_mode_and_level(mode, clip_min, expected):
    cfg, _ = config({"max_steps": 3, "use_vllm": True, "vllm_importance_sampling_mode": mode,
                     "vllm_importance_sampling_clip_min": clip_min, "vllm_importance_sampling_clip_max": 5.0})
    assert (cfg.tis_mode, cfg.tis_level, cfg.tis_low) == expected
    assert cfg.tis_cap == 5.0


@pytest.mark.parametrize("loss_type, extra, expected", [
    ("dapo", {}, ("ppo", "token", 0.2, 0.2)),
    ("grpo", {}, ("ppo", "sequence", 0.2, 0.2)),
    ("dr_grpo", {}, ("ppo", "fixed", 0.2, 0.2)),
    ("cispo", {"epsilon_high": 5.0}, ("cispo", "token", 1.0, 4.0)),  # TRL: weight min(rho, 5), no lower bound
    ("sapo", {}, ("sapo", "sequence", 0.2, 0.2)),
])
def test_each_trl_loss_type_is_an_objective_and_its_aggregation(loss_type, extra, expected):
    cfg, _ = config({"max_steps": 3, "loss_type": loss_type, **extra})
    assert (cfg.objective, cfg.aggregate, cfg.clip_low, cfg.clip_high) == expected


def test_trl_sapo_temperatures_are_the_gate_temperatures():
    cfg, ignored = config({"max_steps": 3, "loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0})
    assert (cfg.sapo_tau_pos, cfg.sapo_tau_neg, ignored) == (0.5, 2.0, [])
    cfg, _ = config({"max_steps": 3, "loss_type": "sapo"})  # TRL's defaults are the paper's
    assert (cfg.sapo_tau_pos, cfg.sapo_tau_neg) == (1.0, 1.05)


@pytest.mark.parametrize("values, message", [
    ({"use_vllm": True, "vllm_importance_sampling_mode": "geometric_mask"},
     "vllm_importance_sampling_mode 'geometric_mask' is not supported by grpo (it supports token_truncate, "
     "token_mask, sequence_truncate, sequence_mask)"),
    ({"use_vllm": True, "vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_clip_min": 0.5},
     "vllm_importance_sampling_clip_min: grpo truncates importance weights from above only"),
    ({"use_vllm": True, "vllm_importance_sampling_clip_max": 0.5}, "tis_cap must be above 1"),
    ({"use_vllm": "false"}, "use_vllm must be true or false, got 'false'"),
    ({"use_vllm": True, "vllm_importance_sampling_correction": "no"},
     "vllm_importance_sampling_correction must be true or false, got 'no'"),
    ({"use_vllm": True, "engine": "own"}, "config gives both 'use_vllm' (TRL) and 'engine' (grpo): give one"),
    ({"use_vllm": True, "vllm_importance_sampling_clip_max": 2.5, "tis_cap": 2.0},
     "config gives both 'vllm_importance_sampling_clip_max' (TRL) and 'tis_cap' (grpo): give one"),
])
def test_vllm_keys_grpo_cannot_honour_are_errors(values, message):
    with pytest.raises(ConfigError) as err:
        config({"max_steps": 3, **values})
    assert message in str(err.value)


def test_max_staleness_is_the_fixed_lag_of_sampling_ahead():
    out, _ = translate({"num_generations": 4, "max_staleness": 2})
    assert out["async_lag"] == 2
