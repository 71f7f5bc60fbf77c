"""The Task record and the registry of built-in tasks."""

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
    examples: tuple[Mapping, ...] = ()  # worked examples (few_shot) before every prompt, as earlier turns

    def messages(self, row: Mapping) -> list[dict[str, str]]:
        """The chat messages for a row (grpo/prompts.py renders them in the run's format): the system
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


_BUILDERS: dict[str, Callable[..., Task]] = {}


def register(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    def wrap(builder: Callable[..., Task]) -> Callable[..., Task]:
        _BUILDERS[name] = builder
        return builder

    return wrap


def list_tasks() -> list[str]:
    _load_builtins()
    return sorted(_BUILDERS)


def describe_tasks() -> list[str]:
    """One line per built-in task: name, size, reward and its own settings."""
    lines = []
    for name in list_tasks():
        task = get_task(name, heldout_size=0)
        settings = ", ".join(f"{k}={v}" for k, v in task.defaults.items()) or "none"
        doc = (_BUILDERS[name].__doc__ or "").strip().splitlines()[0]
        agent = (f"; tools {', '.join(t.__name__ for t in task.tools)}" if task.tools else "") + (
            f"; environment {task.env.__name__}" if task.env else "")
        lines.append(f"{name:<10} {doc} [{len(task.train)} prompts; reward {task.reward.__name__}{agent}; "
                     f"task settings: {settings}]")
    return lines


def get_task(name: str, *, heldout_size: int = 256) -> Task:
    """A built-in task by name."""
    _load_builtins()
    if name not in _BUILDERS:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(_BUILDERS))}")
    return _BUILDERS[name](heldout_size=heldout_size)


def _load_builtins() -> None:
    import grpo.tasks.arithmetic  # noqa: F401  (each module registers its tasks)
    import grpo.tasks.calc  # noqa: F401
    import grpo.tasks.code_retry  # noqa: F401
    import grpo.tasks.coding  # noqa: F401
    import grpo.tasks.countdown  # noqa: F401
