"""TRL ``DistillationConfig`` files, recognised by ``teacher_model_name_or_path`` and read with their own
meanings: ``beta`` is the generalised JSD's (grpo's ``teacher_beta``, the full-vocabulary form TRL's trainer
computes), not the KL coefficient a GRPOConfig's ``beta`` maps to (grpo/trl_config.py). The run is pure
on-policy distillation (``rewards: none``, unless the file names rewards). What it shares with a
GRPOConfig (learning_rate, max_completion_length, temperature, ...) is read as grpo/trl_config.py reads it,
TRL's GRPOConfig defaults filling what the file leaves unset. ``lmbda`` (the share of on-policy samples)
below 1 asks for off-policy samples, which are not built; so do ``seq_kd`` and ``loss_top_k``."""

from __future__ import annotations

from collections.abc import Mapping

from grpo.config import ConfigError
from grpo.trl_config import from_trl, translate

TEACHER_KEY = "teacher_model_name_or_path"
IGNORED = ("teacher_model_init_kwargs",)  # how TRL loads the teacher: grpo loads it as --model loads a model


OWN = (TEACHER_KEY, "beta", "lmbda", "seq_kd", "loss_top_k", "rewards", *IGNORED)  # not a GRPOConfig's meaning


def is_distillation_config(values: Mapping) -> bool:
    return TEACHER_KEY in values


def grpo_config_part(values: Mapping) -> dict[str, object]:
    """The keys a config file shares with a TRL GRPOConfig, read with its meanings: a DistillationConfig's
    own keys left out (the whole file for any other)."""
    if not is_distillation_config(values):
        return dict(values)
    return {k: v for k, v in values.items() if k not in OWN}


def translate_config(values: Mapping) -> tuple[dict[str, object], list[str]]:
    """A config file's values as grpo options, and the keys ignored: a DistillationConfig's as below, any
    other as grpo/trl_config.py translates it."""
    if not is_distillation_config(values):
        return translate(values)
    values = {k: v for k, v in values.items() if v is not None}
    lmbda = values.pop("lmbda", None)
    if not isinstance(lmbda, (int, float)) or lmbda < 1:
        raise ConfigError(f"lmbda {lmbda}: grpo distils on the student's own samples only (off-policy samples, "
                          "lmbda below 1, are not built); give lmbda: 1.0")
    if values.pop("seq_kd", False):
        raise ConfigError("seq_kd (training on the teacher's own samples) is not built; drop it")
    if values.pop("loss_top_k", 0):
        raise ConfigError("loss_top_k (the divergence over the teacher's top k tokens) is not built; the full "
                          "form sums the whole vocabulary: drop it")
    teacher, beta = values.pop(TEACHER_KEY), values.pop("beta", 1.0)
    ignored = [key for key in IGNORED if values.pop(key, None) is not None]
    rewards = values.pop("rewards", ("none",))
    out, more = from_trl(values)
    out.update(teacher=teacher, teacher_loss="full", teacher_beta=float(beta), rewards=rewards, beta=0.0)
    return out, sorted(ignored + more)
