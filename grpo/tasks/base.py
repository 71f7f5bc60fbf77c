"""The Task record, and TaskError."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

RewardFn = Callable[[str, Mapping], float]


class TaskError(ValueError):
    """An unknown task or unusable task data."""


@dataclass(frozen=True)
class Task:
    """Rows with at least ``prompt`` (the user message) and ``answer``; a reward; a system prompt;
    the settings tuned for it (``defaults``: TrainConfig fields a run leaves at 0 take these); for an
    agentic task, the tools the policy may call or the environment class it plays (grpo/episodes.py)."""

    name: str
    train: Sequence[Mapping]
    heldout: Sequence[Mapping]
    reward: RewardFn
    system_prompt: str | None = None
    defaults: Mapping[str, object] = field(default_factory=dict)
    tools: tuple[Callable, ...] = ()
    env: Callable | None = None  # a factory of environments, one per episode

    def messages(self, row: Mapping) -> list[dict[str, str]]:
        """The chat messages for a row (the tokenizer's chat template renders them); a conversational
        row's prompt is its messages already."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if isinstance(row["prompt"], list):
            given = [dict(m) for m in row["prompt"]]
            return given if given and given[0]["role"] == "system" else [*msgs, *given]
        return [*msgs, {"role": "user", "content": str(row["prompt"])}]
