"""The Task record and the registry of built-in tasks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

RewardFn = Callable[[str, Mapping], float]


class TaskError(ValueError):
    """An unknown task or unusable task data."""


@dataclass(frozen=True)
class Task:
    """Rows with at least ``prompt`` (the user message) and ``answer``; a reward; a system prompt."""

    name: str
    train: Sequence[Mapping]
    heldout: Sequence[Mapping]
    reward: RewardFn
    system_prompt: str | None = None

    def messages(self, row: Mapping) -> list[dict[str, str]]:
        """The chat messages for a row (the tokenizer's chat template renders them); a conversational
        row's prompt is its messages already."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        if isinstance(row["prompt"], list):
            given = [dict(m) for m in row["prompt"]]
            return given if given and given[0]["role"] == "system" else [*msgs, *given]
        return [*msgs, {"role": "user", "content": str(row["prompt"])}]


_BUILDERS: dict[str, Callable[..., Task]] = {}


def register(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    def wrap(builder: Callable[..., Task]) -> Callable[..., Task]:
        _BUILDERS[name] = builder
        return builder

    return wrap


def list_tasks() -> list[str]:
    _load_builtins()
    return sorted(_BUILDERS)


def get_task(name: str, *, heldout_size: int = 256) -> Task:
    """A built-in task by name."""
    _load_builtins()
    if name not in _BUILDERS:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(_BUILDERS))}")
    return _BUILDERS[name](heldout_size=heldout_size)


def _load_builtins() -> None:
    import grpo.tasks.arithmetic  # noqa: F401  (each module registers its tasks)
    import grpo.tasks.coding  # noqa: F401
    import grpo.tasks.countdown  # noqa: F401
