"""Prompt formats: how a row's messages become the prompt's tokens, and where a completion ends.

- ``chat``: the tokenizer's chat template, or the user's (``chat_template``, a
  Jinja file); a turn ends at the model's end-of-turn tokens.
- ``plain``: text for a base model, which has no chat template and no
  end-of-turn token: the system prompt, then ``Question: ...`` and the cue
  ``Answer:``. Worked examples (``few_shot``) come before as question and
  answer pairs. A completion ends at a newline or at the next ``Question:``.
- ``r1-zero``: the template DeepSeek-R1-Zero was trained with (DeepSeek-AI
  2025, "DeepSeek-R1", Table 1; TinyZero, Open-Reasoner-Zero and SimpleRL-Zoo
  train base models on it): the assistant thinks in ``<think> </think>`` and
  answers in ``<answer> </answer>``. The cue ends in ``Assistant: <think>``,
  so a completion starts inside the reasoning and ends at ``</answer>``. Its
  reward is the task's checker, or 0.1 for a wrong answer in the right layout
  (TinyZero's format score; see :func:`r1_zero_reward`).
- ``auto``: ``chat`` when the tokenizer has a chat template, else ``plain``; settled
  from the model's files before anything loads (:func:`format_settled`).

Every prompt of a run is rendered here (:func:`encode_prompts`): the
training and held-out prompts, ``grpo eval``'s, an episode's opening. The
text formats are tokenized as a document (``add_special_tokens``: the BOS a
tokenizer adds to text, which Gemma and Llama need); a chat template writes
its own.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.config import PROMPT_FORMATS as FORMATS
from grpo.config import STANDING, ConfigError, TrainConfig
from grpo.rewards.basic import r1_zero_format

if TYPE_CHECKING:
    from grpo.tasks.base import RewardFn, Task

Messages = list[dict]
STOPS = {"chat": (), "plain": ("\n", "Question:"), "r1-zero": ("</answer>",)}
R1_ZERO_PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)
R1_ZERO_CUE = "Assistant: <think>"
FORMAT_SCORE = 0.1  # r1-zero: a wrong answer in the right layout (TinyZero's format_score)
FEW_SHOT_SEED = 4321  # which training rows are the worked examples: the same for every run


@dataclass(frozen=True)
class PromptFormat:
    """A settled format: ``name`` is chat, plain or r1-zero; ``template`` a chat template that replaces
    the tokenizer's (chat only; None: the tokenizer's own)."""

    name: str
    template: str | None = None

    @property
    def stop(self) -> tuple[str, ...]:
        """The stop strings the format implies: a base model has no end-of-turn token."""
        return STOPS[self.name]

    def stops(self, given: Sequence[str]) -> tuple[str, ...]:
        """The given stop strings, then the format's own (each once)."""
        return tuple(dict.fromkeys([*given, *self.stop]))

    def text(self, messages: Messages) -> str:
        """The prompt as text, up to and including the cue the completion continues."""
        if self.name == "plain":
            return plain_text(messages)
        if self.name == "r1-zero":
            return r1_zero_text(messages)
        raise ValueError("the chat format's text is the template's: use encode")

    def encode(self, tokenizer: object, messages: Messages, **extra: object) -> list[int]:
        """The prompt's token ids; ``extra`` goes to the chat template (``tools=``)."""
        if self.name != "chat":
            return list(tokenizer(self.text(messages), add_special_tokens=True)["input_ids"])
        given = {"chat_template": self.template} if self.template else {}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **given, **extra)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def plain_text(messages: Messages) -> str:
    """System prompt, then each user turn as ``Question: ...`` and each assistant turn (a worked
    example) as ``Answer: ...``, ending on the cue ``Answer:``."""
    parts = []
    for m in messages:
        role, content = m["role"], str(m["content"]).strip()
        if role == "system":
            parts.append(f"{content}\n\n")
        elif role == "user":
            parts.append(f"Question: {content}\n")
        elif role == "assistant":
            parts.append(f"Answer: {content}\n\n")
        else:
            raise ConfigError(f"prompt format plain renders system, user and assistant messages, not {role!r}")
    return "".join(parts) + "Answer:"


def r1_zero_text(messages: Messages) -> str:
    """DeepSeek-R1-Zero's template: its preamble (a system prompt follows it), ``User: ...`` and the
    cue ``Assistant: <think>``."""
    lines = [R1_ZERO_PREAMBLE]
    for m in messages:
        role, content = m["role"], str(m["content"]).strip()
        if role == "system":
            lines.append(content)
        elif role == "user":
            lines.append(f"User: {content}")
        else:
            raise ConfigError(f"prompt format r1-zero renders one question (system and user messages), not {role!r}")
    return "\n".join([*lines, R1_ZERO_CUE])


def has_chat_template(tokenizer: object) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_format(tokenizer: object, name: str = "auto", chat_template: str = "") -> PromptFormat:
    """The format a run uses with this tokenizer. ``chat_template``: a Jinja file (implies chat)."""
    if name not in FORMATS:
        raise ConfigError(f"prompt_format must be one of {', '.join(FORMATS)}, got {name!r}")
    if chat_template:
        if name not in ("auto", "chat"):
            raise ConfigError(f"chat_template is a chat format's template; prompt_format {name} has its own")
        return PromptFormat("chat", read_template(chat_template))
    if name == "auto":
        name = "chat" if has_chat_template(tokenizer) else "plain"
    if name == "chat" and not has_chat_template(tokenizer):
        raise ConfigError("prompt_format chat: the model's tokenizer has no chat template; use --prompt-format "
                          "plain or r1-zero (base models), or give --chat-template FILE")
    return PromptFormat(name)


def read_template(path: str) -> str:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read chat_template {path}: {err.strerror or err}") from err
    if not text.strip():
        raise ConfigError(f"chat_template {path} is empty")
    return text


def format_settled(config: TrainConfig, sources: Mapping[str, str], chat: bool | None, source: str
                   ) -> tuple[TrainConfig, dict[str, str]]:
    """The config with its prompt format settled, and the sources saying where it came from: auto decided
    (chat with a chat_template file; else chat when the model's tokenizer has a chat template, plain when it
    has none, as ``source`` read it) and the format's stop strings joined to ``stop`` (after the user's own,
    whose source stays theirs). Unchanged while auto waits on a tokenizer (``chat`` None: no file told) and
    for a config settled already (a resumed run's)."""
    name, sources = config.prompt_format, dict(sources)
    if name == "auto" and not config.chat_template and chat is None:
        return config, sources
    if name == "auto":
        name = "chat" if config.chat_template or chat else "plain"
        sources["prompt_format"] = sources.get("chat_template", source) if config.chat_template else source
    stop = PromptFormat(name).stops(config.stop)
    if stop != config.stop and sources.get("stop") not in STANDING:
        sources["stop"] = source if name != config.prompt_format else "default"
    return replace(config, prompt_format=name, stop=stop), sources


def loaded_format(config: TrainConfig, sources: Mapping[str, str], tokenizer: object
                  ) -> tuple[PromptFormat, TrainConfig, dict[str, str]]:
    """The run's format, built from the config resolution settled; where no file told before the model loaded
    (a hub id not in the local cache, a model object given without its tokenizer), auto is settled now from the
    loaded tokenizer (source tokenizer)."""
    config, sources = format_settled(config, sources, has_chat_template(tokenizer), "tokenizer")
    return prompt_format(tokenizer, config.prompt_format, config.chat_template), config, sources


def encode_prompts(tokenizer: object, messages: Sequence[Messages], fmt: PromptFormat | None = None) -> list[list[int]]:
    """Token ids of each prompt in ``fmt`` (None: ``auto``, so a tokenizer without a chat template
    renders plain text rather than failing)."""
    fmt = fmt or prompt_format(tokenizer)
    return [fmt.encode(tokenizer, msgs) for msgs in messages]


def run_task(config: TrainConfig, *, task: Task | None = None, require_answer: bool = True) -> Task:
    """The task as a run has it, from its config: ``task`` if given, else the one the config names
    (a built-in task or ``data``, with its fields, template, system prompt and held-out split), then
    formatted (:func:`format_task`). ``grpo eval`` of the run's model builds it here; training in these
    two halves (grpo.run.build.resolve_run loads it, the trainer formats it)."""
    return format_task(task if task is not None else config_task(config, require_answer=require_answer), config)


def config_task(config: TrainConfig, *, require_answer: bool = True) -> Task:
    """The task the config names, as loaded: a built-in task or ``data``, with its fields, template, system
    prompt and held-out split (not yet formatted)."""
    from grpo.tasks import load_task

    return load_task(config.task, data=config.data, heldout_size=config.eval_size, prompt_field=config.prompt_field,
                     answer_field=config.answer_field, system_prompt=config.system_prompt,
                     prompt_template=config.prompt_template, eval_data=config.eval_data,
                     require_answer=require_answer, data_config=config.data_config, data_split=config.data_split,
                     eval_config=config.eval_config, eval_split=config.eval_split)


def run_prompts(tokenizer: object, task: Task, config: TrainConfig, rows: Sequence[Mapping]) -> list[list[int]]:
    """The token ids a run feeds its model for these rows' prompts: the task's messages (its system prompt,
    its few-shot examples, the row) in the config's format (prompt_format, chat_template). The one
    renderer of a run's prompts: training's and pre-flight's (the trainer's prompts) and ``grpo eval``'s."""
    fmt = prompt_format(tokenizer, config.prompt_format, config.chat_template)
    return encode_prompts(tokenizer, [task.messages(r) for r in rows], fmt)


def format_task(task: Task, config: TrainConfig) -> Task:
    """The task as the format asks: ``few_shot`` worked examples drawn from (and then left out of) the
    training rows; under r1-zero, :func:`r1_zero_reward` around its checker, and no tuned token limit
    (the task's is for a bare answer: the limit is fitted to the data, as for a user's file)."""
    if config.few_shot:
        if len(task.train) <= config.few_shot:
            raise ConfigError(f"few_shot ({config.few_shot}) draws its worked examples from the training rows, "
                              f"and there are {len(task.train)}: give fewer, or more training rows")
        picked = set(random.Random(FEW_SHOT_SEED).sample(range(len(task.train)), config.few_shot))
        examples = tuple(task.train[i] for i in sorted(picked))
        train = [r for i, r in enumerate(task.train) if i not in picked]
        task = replace(task, train=train, examples=examples)
    if config.prompt_format == "r1-zero" and not getattr(task.reward, "r1_zero", False):
        # a task's tuned token limit is for a bare answer; thinking first needs room, which pre-flight fits
        defaults = {k: v for k, v in task.defaults.items() if k != "max_new_tokens"}
        task = replace(task, reward=r1_zero_reward(task.reward), defaults=defaults)
    return task


def r1_zero_reward(checker: RewardFn) -> RewardFn:
    """The checker's score; a wrong answer (below 1.0) in R1-Zero's layout scores at least FORMAT_SCORE.

    TinyZero's scheme (1.0 right, 0.1 well-formed but wrong, 0 otherwise), so a completion counts as
    correct (1.0) exactly when the checker says so. The layout is ``think_format``'s, read after the
    cue's ``<think>`` (:func:`grpo.rewards.basic.r1_zero_format`).
    """
    return R1ZeroReward(checker)


@dataclass(frozen=True)
class R1ZeroReward:
    """:func:`r1_zero_reward`'s reward: a class of this module, not a closure, so that it pickles by name
    when its workers start from a fresh interpreter (grpo/system/workers.py)."""

    checker: RewardFn
    r1_zero = True

    @property
    def __name__(self) -> str:
        return f"{getattr(self.checker, '__name__', 'reward')}_r1_zero"

    @property
    def needs_sandbox(self) -> bool:  # a code checker still runs sandboxed
        return getattr(self.checker, "needs_sandbox", False)

    def __call__(self, completion: str, example: Mapping) -> float:
        score = self.checker(completion, example)
        return score if score >= 1.0 else max(score, FORMAT_SCORE * r1_zero_format(completion, example))
