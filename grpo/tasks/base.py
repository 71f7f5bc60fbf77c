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
    agentic task, the tools the policy may call or the environment class it plays (grpo/sampling/episodes.py)."""

    name: str
    train: Sequence[Mapping]
    heldout: Sequence[Mapping]
    reward: RewardFn
    system_prompt: str | None = None
    defaults: Mapping[str, object] = field(default_factory=dict)
    tools: tuple[Callable, ...] = ()
    env: Callable | None = None  # a factory of environments, one per episode
    examples: tuple[Mapping, ...] = ()  # worked examples (few_shot) before every prompt, as earlier turns
    data: Mapping[str, object] = field(default_factory=dict)  # a data source's splits as read (grpo/tasks/data.py)

    def messages(self, row: Mapping) -> list[dict[str, str]]:
        """The chat messages for a row (grpo/sampling/prompts.py renders them in the run's format): the system
        prompt, each worked example as a user and an assistant turn (its prompt and answer), then the
        row's prompt; a conversational row's prompt is its messages already (the examples go before them)."""
        shots = [{"role": role, "content": str(ex[key])} for ex in self.examples
                 for role, key in (("user", "prompt"), ("assistant", "answer"))]
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if isinstance(row["prompt"], list):
            given = [dict(m) for m in row["prompt"]]
            if given and given[0]["role"] == "system":
                return [given[0], *shots, *given[1:]]
            return [*msgs, *shots, *given]
        return [*msgs, *shots, {"role": "user", "content": str(row["prompt"])}]
