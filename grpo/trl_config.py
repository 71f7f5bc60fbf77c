"""TRL ``GRPOConfig`` files: each TRL key becomes the ``grpo`` option that does the same thing.

A config file may use either vocabulary. When it holds a key that only TRL uses,
it is read as a TRL config: the keys it does not set take TRL's defaults (its
learning rate, temperature, completion length, clipping and batch, and TRL's
algorithm: no dynamic sampling, prompts drawn uniformly), so the run is the one
TRL would make. Then:

- a renamed key (``learning_rate`` -> ``lr``) is renamed, its type checked under its TRL name;
- a key whose value ``grpo`` cannot honour and that changes results (a loss type it
  lacks) is an error;
- a key that has no meaning here (``bf16``, ``push_to_hub``, vLLM settings) is
  returned so the caller lists it once in a warning;
- a key in neither vocabulary is an error suggesting the nearest key of both.

The table in docs/from-trl-verl.md is this module in prose.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping

from grpo.config import ConfigError, TrainConfig, _coerce

RENAMED: dict[str, str] = {
    "learning_rate": "lr",
    "num_generations": "group_size",
    "max_completion_length": "max_new_tokens",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "num_iterations": "epochs",
    "max_steps": "steps",
    "output_dir": "output",
    "logging_steps": "log_every",
    "save_steps": "save_every",
    "save_total_limit": "keep_checkpoints",
    "eval_steps": "eval_every",
    "model_name_or_path": "model",
    "dataset_name": "data",
    "dataset_config": "data_config",  # TRL's ScriptArguments, beside dataset_name
    "dataset_train_split": "data_split",
    "dataset_test_split": "eval_split",
    "lora_r": "lora_rank",
    "max_staleness": "async_lag",  # an upper bound on the lag in TRL's async trainer; here the lag itself
}

# TRL's defaults (GRPOConfig, TrainingArguments) for the options a TRL config leaves unset.
TRL_DEFAULTS: dict[str, object] = {
    "lr": 1e-6, "group_size": 8, "max_new_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
    "beta": 0.0, "clip_low": 0.2, "epochs": 1, "scale": "group", "aggregate": "token", "ratio_level": "token",
    "batch_size": 8, "warmup_steps": 0, "weight_decay": 0.0, "max_grad_norm": 1.0, "seed": 42,
    "log_every": 10, "save_every": 500, "filter_groups": False, "sampler": "uniform",
    "gradient_checkpointing": True,  # GRPOConfig's default, unlike TrainingArguments'
}

# TRL's loss_type: the objective and the aggregation TRL uses with it (bnpo, luspo and vespo are not built)
LOSS_TYPES = {"dapo": ("ppo", "token"), "grpo": ("ppo", "sequence"), "dr_grpo": ("ppo", "fixed"),
              "cispo": ("cispo", "token"), "sapo": ("sapo", "sequence")}
# TRL's vllm_importance_sampling_mode: grpo's tis_mode and tis_level (TRL's sequence ratio is the product)
TIS_MODES = {"token_truncate": ("truncate", "token"), "token_mask": ("mask", "token"),
             "sequence_truncate": ("truncate", "sequence_ratio"), "sequence_mask": ("mask", "sequence_ratio")}
TRL_TIS_MODE = "sequence_mask"  # TRL's default
SCALE_REWARDS = {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}

# Keys accepted only at the value that leaves results as grpo computes them.
NEUTRAL: dict[str, tuple[object, ...]] = {
    "delta": (None,), "mask_truncated_completions": (False, True), "sync_ref_model": (False,),
    "top_entropy_quantile": (1.0, 1), "entropy_coef": (0.0, 0), "use_adaptive_entropy": (False,),
    "repetition_penalty": (1.0, 1), "min_p": (None, 0.0, 0), "multi_objective_aggregation": ("sum_then_normalize",),
    "generation_batch_size": (None,), "steps_per_generation": (None,), "use_bias_correction_kl": (False,),
    "off_policy_mask_threshold": (None,), "lr_scheduler_type": ("constant", "constant_with_warmup"),
    "warmup_ratio": (0.0, 0, None), "lora_dropout": (0.0, 0), "use_dora": (False,), "use_rslora": (False,),
    "load_in_4bit": (False,), "load_in_8bit": (False,), "neftune_noise_alpha": (None,),
}

# GRPOConfig, TrainingArguments, ModelConfig and the TRL scripts' ScriptArguments keys that change
# nothing grpo computes (precision, logging back-ends, the hub, vLLM, data loaders): warned, ignored.
IGNORED = frozenset("""
model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32 remove_unused_columns
num_generations_eval ds3_gather_for_generation shuffle_dataset pad_to_multiple_of generation_kwargs
chat_template_kwargs cache_implementation vllm_mode vllm_model_impl
vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout
vllm_group_port vllm_max_model_length vllm_tensor_parallel_size
vespo_k_pos vespo_lambda_pos vespo_k_neg vespo_lambda_neg ref_model_mixup_alpha ref_model_sync_steps
entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target max_tool_calling_iterations log_completions
log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo
use_transformers_continuous_batching transformers_continuous_batching_config use_transformers_paged
max_prompt_length vllm_device vllm_dtype vllm_guided_decoding_regex wandb_log_unique_prompts
accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2 adam_epsilon
auto_find_batch_size average_tokens_across_devices batch_eval_metrics bf16 bf16_full_eval data_seed
dataloader_drop_last dataloader_in_order dataloader_multiprocessing_context dataloader_num_workers
dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor ddp_backend ddp_broadcast_buffers
ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph ddp_timeout debug deepspeed disable_tqdm do_eval
do_predict do_train enable_jit_checkpoint eval_accumulation_steps eval_delay eval_do_concat_batches eval_on_start
eval_strategy eval_use_gather_object fp16 fp16_full_eval fsdp_config full_determinism
gradient_checkpointing_kwargs greater_is_better hub_always_push hub_model_id hub_private_repo hub_revision
hub_strategy hub_token ignore_data_skip include_for_metrics include_num_input_tokens_seen label_names
label_smoothing_factor length_column_name liger_kernel_config load_best_model_at_end local_rank log_level
log_level_replica log_on_each_node logging_first_step logging_nan_inf_filter logging_strategy logging_dir
lr_scheduler_kwargs metric_for_best_model optim optim_args optim_target_modules overwrite_output_dir
parallelism_config per_device_eval_batch_size prediction_loss_only project push_to_hub resume_from_checkpoint
restore_callback_states_from_checkpoint run_name save_on_each_node save_only_model save_strategy
skip_memory_metrics tf32 torch_compile torch_compile_backend torch_compile_mode torch_empty_cache_steps
trackio_bucket_id trackio_space_id trackio_static_space_id train_sampling_strategy use_cache use_cpu
use_liger_kernel use_liger_loss model_revision dtype torch_dtype attn_implementation lora_target_modules
lora_target_parameters lora_modules_to_save lora_task_type bnb_4bit_quant_type use_bnb_nested_quant
bnb_4bit_quant_storage dataset_streaming
gradient_checkpointing_use_reentrant ignore_bias_buffers
""".split())

# vLLM's keys that mean something with use_vllm (vllm_mode and the server's address only place the engine)
VLLM_KEYS = ("vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
             "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap")
TRL_TIS_CAP = 3.0  # TRL's vllm_importance_sampling_clip_max
TRL_VLLM_MEMORY = 0.3  # TRL's vllm_gpu_memory_utilization
_VLLM_ONLY = frozenset(("use_vllm", *VLLM_KEYS))  # mean something only with use_vllm: true
# a TRL key and the grpo option it sets: a config gives one of the two
_VLLM_PAIRS = (("use_vllm", "engine"), ("vllm_gpu_memory_utilization", "vllm_memory"),
               ("vllm_enable_sleep_mode", "vllm_sleep"),
               ("vllm_importance_sampling_mode", "tis_level"), ("vllm_importance_sampling_mode", "tis_mode"),
               ("vllm_importance_sampling_clip_min", "tis_low"), ("vllm_importance_sampling_clip_max", "tis_cap"),
               ("vllm_importance_sampling_cap", "tis_cap"), ("vllm_importance_sampling_correction", "tis_cap"))

# Keys translated by their own rule below rather than by renaming.
CONVERTED = ("loss_type", "sapo_temperature_pos", "sapo_temperature_neg", "scale_rewards", "importance_sampling_level", "per_device_train_batch_size",
             "gradient_accumulation_steps", "use_peft", "report_to", "num_train_epochs", "reward_weights",
             "use_vllm", *VLLM_KEYS)

_GRPO_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
TRL_KEYS = frozenset(RENAMED) | frozenset(NEUTRAL) | IGNORED | frozenset(CONVERTED) | {
    "beta", "temperature", "top_p", "top_k", "seed", "warmup_steps", "weight_decay", "max_grad_norm", "lora_alpha",
}


def is_trl_config(values: Mapping) -> bool:
    """Whether a config uses TRL's vocabulary: it holds a key that only TRL has and that means something
    (a grpo config with a stray ``bf16``, or vLLM keys without ``use_vllm: true``, stays a grpo config,
    with grpo's defaults)."""
    return any(key in TRL_KEYS and key not in _GRPO_KEYS and key not in IGNORED and key not in _VLLM_ONLY
               for key in values) or values.get("use_vllm") is True


def check_keys(values: Mapping) -> None:
    """A key in neither vocabulary is an error that suggests the nearest key of both."""
    for key in values:
        if key not in _GRPO_KEYS and key not in TRL_KEYS:
            hint = difflib.get_close_matches(str(key), sorted(_GRPO_KEYS | TRL_KEYS), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"unknown config key {key!r}{extra}")


def _typed(trl_key: str, value: object, grpo_key: str) -> object:
    """A TRL value checked against the grpo option's type, under its TRL name; numbers written
    as strings ("1e-6", which YAML reads as text) are read as numbers, as TRL's parser does."""
    kind = typing.get_type_hints(TrainConfig)[grpo_key]
    if kind in (int, float) and isinstance(value, str):
        try:
            value = kind(float(value)) if kind is int and float(value).is_integer() else kind(value)
        except ValueError:
            pass
    return _coerce(trl_key, value, kind)


def _choice(key: str, value: object, table: Mapping) -> object:
    if value not in table:
        allowed = ", ".join(str(k) for k in table if isinstance(k, str))
        raise ConfigError(f"{key} {value!r} is not supported by grpo (it supports {allowed})")
    return table[value]


def _int(key: str, values: Mapping, default: int) -> int:
    value = values.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{key} must be a positive int, got {value!r}")
    return value


def _converted(values: Mapping) -> dict[str, object]:
    """The options made from TRL keys that are not plain renames."""
    out: dict[str, object] = {}
    if "loss_type" in values:
        out["objective"], out["aggregate"] = _choice("loss_type", values["loss_type"], LOSS_TYPES)
        out.update(_objective_keys(values))
    if "scale_rewards" in values:
        out["scale"] = _choice("scale_rewards", values["scale_rewards"], SCALE_REWARDS)
    if "importance_sampling_level" in values:
        out["ratio_level"] = _choice("importance_sampling_level", values["importance_sampling_level"],
                                     {"token": "token", "sequence": "sequence"})
    if {"per_device_train_batch_size", "gradient_accumulation_steps"} & set(values):
        # One optimiser step per generation batch, as TRL does when steps_per_generation is unset.
        per_device = _int("per_device_train_batch_size", values, 8)
        out["batch_size"] = per_device * _int("gradient_accumulation_steps", values, 1)
    if values.get("use_peft"):
        out["lora_rank"] = _typed("lora_r", values.get("lora_r", 16), "lora_rank")
        out["lora_alpha"] = _typed("lora_alpha", values.get("lora_alpha", 32), "lora_alpha")
    report_to = values.get("report_to", [])
    if report_to == "wandb" or (isinstance(report_to, list) and "wandb" in report_to):
        out["wandb"] = True
    if "reward_weights" in values and values["reward_weights"] is not None:
        out["reward_weights"] = values["reward_weights"]
    if values.get("mask_truncated_completions") is True:
        # DAPO's overlong filtering; here the cut rows also leave their group's mean and std (errored rows)
        out["mask_truncated"] = True
    if _bool("use_vllm", values, False):
        # the grpo options the config gives itself stand (a key of both vocabularies is an error, see from_trl)
        out.update({key: value for key, value in _vllm(values).items() if key not in values})
    return out


def _objective_keys(values: Mapping) -> dict[str, object]:
    """What TRL's cispo and sapo read: cispo's weight is min(rho, epsilon_high), no lower bound (grpo's
    clip_low 1, clip_high epsilon_high - 1); sapo's sapo_temperature_pos/neg are the gate's temperatures."""
    out: dict[str, object] = {}
    if values["loss_type"] == "cispo" and "clip_high" not in values:
        cap = values.get("epsilon_high")
        if cap is None or _typed("epsilon_high", cap, "clip_high") <= 1.0:
            raise ConfigError("loss_type cispo: TRL caps the weight at epsilon_high itself; give epsilon_high above 1 "
                              "(TRL recommends 5.0)")
        out["clip_low"], out["clip_high"] = 1.0, _typed("epsilon_high", cap, "clip_high") - 1.0
    if values["loss_type"] == "sapo":
        for trl_key, key in (("sapo_temperature_pos", "sapo_tau_pos"), ("sapo_temperature_neg", "sapo_tau_neg")):
            if trl_key in values:
                out[key] = _typed(trl_key, values[trl_key], key)
    return out


def _bool(key: str, values: Mapping, default: bool) -> bool:
    value = values.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _vllm(values: Mapping) -> dict[str, object]:
    """use_vllm and its keys: the vLLM engine and its mismatch correction (grpo's --tis-*).

    TRL's four modes are grpo's tis_mode x tis_level (TIS_MODES): its sequence
    ratio is the product of the token ratios, grpo's sequence_ratio level.
    clip_max (or the deprecated cap) is tis_cap; clip_min is tis_low under a
    mask mode, and refused under a truncate mode (grpo truncates from above only).
    """
    memory = values.get("vllm_gpu_memory_utilization", TRL_VLLM_MEMORY)
    out: dict[str, object] = {"engine": "vllm",
                              "vllm_memory": _typed("vllm_gpu_memory_utilization", memory, "vllm_memory"),
                              "vllm_sleep": _bool("vllm_enable_sleep_mode", values, False)}  # TRL's default: off
    if not _bool("vllm_importance_sampling_correction", values, True):
        out["tis_cap"] = 0.0
        return out
    if "vllm_importance_sampling_mode" not in values and {"tis_level", "tis_mode"} & set(values):
        return {**out, "tis_cap": _typed("vllm_importance_sampling_clip_max", values.get(
            "vllm_importance_sampling_clip_max", TRL_TIS_CAP), "tis_cap")}  # grpo's own correction stands
    mode = values.get("vllm_importance_sampling_mode", TRL_TIS_MODE)
    out["tis_mode"], out["tis_level"] = _choice("vllm_importance_sampling_mode", mode, TIS_MODES)
    floor = values.get("vllm_importance_sampling_clip_min")
    if floor is not None and _typed("vllm_importance_sampling_clip_min", floor, "tis_low") > 0:  # 0: no floor
        if out["tis_mode"] == "truncate":
            raise ConfigError(f"vllm_importance_sampling_clip_min: grpo truncates importance weights from above "
                              f"only; drop the key or use a mask mode (not {mode})")
        out["tis_low"] = _typed("vllm_importance_sampling_clip_min", floor, "tis_low")
    cap = values.get("vllm_importance_sampling_clip_max", values.get("vllm_importance_sampling_cap", TRL_TIS_CAP))
    out["tis_cap"] = _typed("vllm_importance_sampling_clip_max", cap, "tis_cap")
    return out


def _check_neutral(values: Mapping) -> None:
    for key, allowed in NEUTRAL.items():
        if key in values and values[key] not in allowed:
            raise ConfigError(
                f"{key}: {values[key]!r} would change results and grpo does not support it "
                f"(accepted: {', '.join(repr(a) for a in allowed)})"
            )
    if "num_train_epochs" in values and "max_steps" not in values:
        raise ConfigError("num_train_epochs: grpo counts steps, not epochs; set max_steps instead")


def _renamed(values: Mapping) -> dict[str, object]:
    """The TRL keys that are a grpo option under another name (or the same), type-checked.
    LoRA's lora_r and lora_alpha count only with use_peft, as in TRL (see _converted)."""
    same = {k: k for k in ("beta", "temperature", "top_p", "top_k", "seed", "warmup_steps", "weight_decay",
                           "max_grad_norm")}
    return {grpo_key: _typed(trl_key, values[trl_key], grpo_key)
            for trl_key, grpo_key in {**RENAMED, **same}.items()
            if trl_key in values and values[trl_key] is not None and trl_key != "lora_r"}


def from_trl(values: Mapping) -> tuple[dict[str, object], list[str]]:
    """A TRL config as grpo options (TRL's defaults for what it leaves unset), and the keys ignored.

    A key set to null, and ``max_steps`` <= 0 (TRL's "not set"), count as unset. TRL's max_steps,
    logging_steps, save_steps and warmup_steps count optimiser steps, and each generation batch is
    reused num_iterations (mu) times, one optimiser step each; grpo counts generation steps, each
    with mu passes, so those step counts are divided by mu.
    """
    values = {k: v for k, v in values.items()
              if v is not None and not (k == "max_steps" and isinstance(v, int) and v <= 0)}
    check_keys(values)
    _check_neutral(values)
    both = [(t, g) for t, g in (*RENAMED.items(), *_VLLM_PAIRS) if t in values and g in values]
    if both:
        raise ConfigError(f"config gives both {both[0][0]!r} (TRL) and {both[0][1]!r} (grpo): give one")
    out: dict[str, object] = dict(TRL_DEFAULTS)
    out.update(_own(values))
    if "epsilon_high" not in values and "clip_high" not in values:
        out["clip_high"] = out["clip_low"]  # TRL: epsilon_high defaults to epsilon
    out.update(_converted(values))
    _per_generation(out)
    if "batch_size" in out and "prompts_per_step" in values:
        del out["batch_size"]
    if out.get("batch_size") and out["batch_size"] % out["group_size"]:
        raise ConfigError(
            f"per_device_train_batch_size x gradient_accumulation_steps ({out['batch_size']}) must be a "
            f"multiple of num_generations ({out['group_size']})"
        )
    return out, _ignored(values)


def _own(values: Mapping) -> dict[str, object]:
    """The grpo options a TRL config's own keys name (grpo's, and TRL's renamed), before its conversions."""
    return {**{key: value for key, value in values.items() if key in _GRPO_KEYS and key not in CONVERTED},
            **_renamed(values)}


def trl_implied(values: Mapping) -> set[str]:
    """The options a config file's translation takes from TRL's defaults, not from a key of its own: the
    file fills them, but they are not given (an objective or estimator that does not read one does not
    refuse it). Empty for a file in grpo's vocabulary."""
    if not is_trl_config(values):
        return set()
    values = {k: v for k, v in values.items() if v is not None}
    own = set(_own(values)) | set(_converted(values))
    if "clip_low" in own and "epsilon_high" not in values:
        own.add("clip_high")  # TRL's epsilon_high is the file's epsilon
    return set(from_trl(values)[0]) - own


def _per_generation(out: dict[str, object]) -> None:
    """TRL's optimiser-step counts as grpo's generation-step counts: divided by mu = num_iterations."""
    mu = out.get("epochs", 1)
    if not isinstance(mu, int) or mu <= 1:
        return
    for key in ("steps", "log_every", "save_every", "eval_every", "warmup_steps"):
        value = out.get(key)
        if isinstance(value, int) and value > 0:
            out[key] = max(1, -(-value // mu))


def _ignored(values: Mapping) -> list[str]:
    """The keys that change nothing here: IGNORED ones, num_train_epochs beside max_steps (which wins,
    as in TRL), report_to other than wandb, and LoRA settings without use_peft."""
    ignored = [k for k in values if k in IGNORED or k == "num_train_epochs"]
    if "report_to" in values and "wandb" not in (values["report_to"] or ()):
        ignored.append("report_to")
    if not values.get("use_peft"):
        ignored += [k for k in ("lora_r", "lora_alpha") if k in values]
    if values.get("use_vllm") is not True:  # as in TRL, they count only with use_vllm
        ignored += [k for k in _VLLM_ONLY if k in values]
    return sorted(ignored)


def translate(values: Mapping) -> tuple[dict[str, object], list[str]]:
    """A config file's values as grpo options, and the TRL keys ignored (to warn about once)."""
    if is_trl_config(values):
        return from_trl(values)
    check_keys(values)
    ignored = sorted(k for k in values if k in IGNORED or k in _VLLM_ONLY)
    return {k: v for k, v in values.items() if k not in IGNORED and k not in _VLLM_ONLY}, ignored
