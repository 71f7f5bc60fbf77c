"""The teacher's options: what a distillation run refuses, each in one line, before anything loads.

``--rewards none`` is the run with no reward: the teacher's term is its whole signal (pure on-policy
distillation), so it needs a teacher. The teacher term is its own per-token term of the loss, aggregated as
the surrogate is (``--aggregate``), so it is defined under every objective, the sequence-level ones (GMPO's
geometric mean, GSPO's sequence ratio) included: it does not pass through their ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from grpo.config import ConfigError, TrainConfig

NO_REWARD = "none"  # --rewards none: pure distillation (grpo/rewards/basic.py no_reward scores 0)
TEACHER_OPTIONS = ("teacher_coef", "teacher_loss", "teacher_beta")
NOT_BUILT = "teacher with {what} is not built: {instead}"


def check_teacher(config: TrainConfig, processes: int, *, resumed: bool = False) -> None:
    """Raise ConfigError, one line naming the option, for a teacher setting a run cannot use. A teacher's
    option given without a teacher is refused, as grpo.config_resolution.refuse_unread refuses the others, unless the
    run is ``resumed`` (its saved config names every option)."""
    if NO_REWARD in config.rewards:
        check_no_reward(config, resumed=resumed)
    if not config.teacher:
        for name in () if resumed else TEACHER_OPTIONS:
            if name in config.given:
                raise ConfigError(f"{name} is read with --teacher only (no teacher is given)")
        return
    if "teacher_beta" in config.given and config.teacher_loss != "full" and not resumed:
        raise ConfigError("teacher_beta is read by teacher_loss full only (the sampled form is the reverse KL)")
    if not 0.0 <= config.teacher_beta <= 1.0:
        raise ConfigError(f"teacher_beta must be in [0, 1], got {config.teacher_beta}")
    if config.teacher_coef <= 0.0:
        raise ConfigError(f"teacher_coef must be positive with a teacher, got {config.teacher_coef}")
    unbuilt = {"several processes (--nproc, torchrun)": (processes > 1, "distil with one process"),
               "--engine vllm": (config.engine == "vllm", "use the own engine"),
               "--async-lag": (config.async_lag > 0, "drop --async-lag")}
    for what, (refused, instead) in unbuilt.items():
        if refused:
            raise ConfigError(NOT_BUILT.format(what=what, instead=instead))


def check_no_reward(config: TrainConfig, *, resumed: bool = False) -> None:
    """--rewards none: alone, with a teacher other than the model itself, and without the frontier sampler."""
    if len(config.rewards) > 1:
        raise ConfigError("rewards none means no reward at all: name no other reward beside it")
    if not config.teacher:
        raise ConfigError("rewards none leaves the run no signal: give --teacher MODEL (on-policy "
                          "distillation), or a reward")
    if config.teacher == config.model:
        raise ConfigError("rewards none with the model as its own teacher: the teacher's term is zero, "
                          "nothing to learn; give another --teacher, or a reward")
    if config.sampler == "frontier" and "sampler" in config.given and not resumed:
        raise ConfigError("sampler frontier with rewards none: it draws the prompts whose groups mix "
                          "rewards, and there are none; drop --sampler (uniform under rewards none)")


def vocabulary(name: str) -> Mapping[str, int]:
    """The token ids of the model ``name``'s tokenizer (anything --model takes), read from its tokenizer
    files alone: no weight is loaded (a GGUF is converted once, as --model converts it)."""
    from transformers import AutoTokenizer

    from grpo.models import ModelError, adapter_base, is_adapter_folder, resolve_model_path

    folder = Path(name).expanduser()
    if is_adapter_folder(name):
        if not (folder / "tokenizer_config.json").is_file():
            return vocabulary(adapter_base(folder, name))
        path = str(folder)
    else:
        path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path).get_vocab()
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the tokenizer of {name}: {str(err).splitlines()[0]}") from err


def check_vocabulary(teacher: str, student: Mapping[str, int]) -> None:
    """Refuse, before the teacher's weights load, a teacher whose tokenizer differs from the student's: the
    teacher scores the student's token ids, which must mean the same tokens to both."""
    mine = vocabulary(teacher)
    if dict(mine) != dict(student):
        differ = sorted(set(mine.items()) ^ set(student.items()), key=lambda kv: kv[1])
        first = f"; e.g. {differ[0][0]!r} is id {mine.get(differ[0][0])} to the teacher" if differ else ""
        raise ConfigError(f"teacher {teacher}: its tokenizer differs from the model's ({len(mine)} tokens against "
                          f"{len(student)}{first}); the teacher scores the model's token ids, so both need one "
                          "vocabulary")
