"""TRL ``DistillationConfig`` files, recognised by ``teacher_model_name_or_path`` and read with their own
meanings: ``beta`` is the generalised JSD's (grpo's ``teacher_beta``, the full-vocabulary form TRL's trainer
computes), not the KL coefficient a GRPOConfig's ``beta`` maps to (grpo/trl_config.py). The run is pure
on-policy distillation (``rewards: none``, unless the file names rewards). What it shares with a
GRPOConfig (learning_rate, max_completion_length, temperature, ...) is read as grpo/trl_config.py reads it,
TRL's GRPOConfig defaults filling what the file leaves unset (a DistillationConfig's own keys: ``lmbda``
1.0, TRL's default; ``beta`` 1.0; ``loss_top_k`` 0, the full vocabulary, where TRL's default is 1, its top-1
token plus the tail). ``lmbda`` (the share of on-policy samples) below 1 asks for off-policy samples, which
are not built; so do ``seq_kd``, a positive ``loss_top_k`` and a teacher server. ``num_generations`` is the
group size: 1 (a setting distillation files use) is refused, as ``--group-size 1`` is; give 2 or more."""

from __future__ import annotations

from collections.abc import Mapping

from grpo.config import ConfigError
from grpo.trl_config import from_trl, translate

TEACHER_KEY = "teacher_model_name_or_path"
# how TRL loads the teacher (grpo loads it as --model loads a model); the top-k loss's own settings, with no
# meaning at loss_top_k 0; max_length (prompt and completion, TRL's truncation: grpo's limits are its own)
IGNORED = ("teacher_model_init_kwargs", "loss_add_tail", "reverse_kl_top_1_mode", "max_length")
SERVER = ("use_teacher_server", "teacher_model_server_url")  # a teacher behind a server: refused when set


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
    lmbda = values.pop("lmbda", 1.0)  # TRL's default
    if not isinstance(lmbda, (int, float)) or lmbda < 1:
        raise ConfigError(f"lmbda {lmbda}: grpo distils on the student's own samples only (off-policy samples, "
                          "lmbda below 1, are not built); give lmbda: 1.0")
    if values.pop("seq_kd", False):
        raise ConfigError("seq_kd (training on the teacher's own samples) is not built; drop it")
    if values.pop("loss_top_k", 0):
        raise ConfigError("loss_top_k (the divergence over the teacher's top k tokens; TRL's default is 1) is not "
                          "built; grpo's full form sums the whole vocabulary, TRL's loss_top_k 0: give loss_top_k: 0")
    server = [key for key in SERVER if values.pop(key, None)]
    if server:
        raise ConfigError(f"{server[0]}: a teacher behind a server is not built; grpo loads the teacher itself "
                          "(teacher_model_name_or_path): drop it")
    if values.pop("teacher_model_revision", "main") != "main":
        raise ConfigError("teacher_model_revision: grpo loads the teacher as --model loads a model, with no "
                          "revision: download that revision and name its folder")
    teacher, beta = values.pop(TEACHER_KEY), values.pop("beta", 1.0)
    ignored = [key for key in IGNORED if values.pop(key, None) is not None]
    rewards = values.pop("rewards", ("none",))
    out, more = from_trl(values)
    out.update(teacher=teacher, teacher_loss="full", teacher_beta=float(beta), rewards=rewards, beta=0.0)
    return out, sorted(ignored + more)
