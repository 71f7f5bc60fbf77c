"""The built-in tasks by name: get_task, list_tasks, and describe_tasks for `grpo tasks`."""

from __future__ import annotations

from collections.abc import Callable

from grpo.tasks.base import Task, TaskError


def _builders() -> dict[str, Callable[..., Task]]:
    """Each built-in task's builder, by the name a run gives. The task modules are imported on first use:
    they bring in grpo.rewards, and with it torch, which `grpo --help` and a bad option need not wait for."""
    from grpo.tasks.arithmetic import mixed_arithmetic, two_digit_addition
    from grpo.tasks.calc import calc
    from grpo.tasks.code_retry import code_retry
    from grpo.tasks.coding import coding
    from grpo.tasks.countdown import countdown

    return {"add": two_digit_addition, "arith-mix": mixed_arithmetic, "calc": calc, "code": coding,
            "code-retry": code_retry, "countdown": countdown}


def list_tasks() -> list[str]:
    return sorted(_builders())


def describe_tasks() -> list[str]:
    """One line per built-in task: name, size, reward and its own settings."""
    lines = []
    for name in list_tasks():
        task = get_task(name, heldout_size=0)
        settings = ", ".join(f"{k}={v}" for k, v in task.defaults.items()) or "none"
        doc = (_builders()[name].__doc__ or "").strip().splitlines()[0]
        agent = (f"; tools {', '.join(t.__name__ for t in task.tools)}" if task.tools else "") + (
            f"; environment {task.env.__name__}" if task.env else "")
        lines.append(f"{name:<10} {doc} [{len(task.train)} prompts; reward {task.reward.__name__}{agent}; "
                     f"task settings: {settings}]")
    return lines


def get_task(name: str, *, heldout_size: int = 256) -> Task:
    """A built-in task by name."""
    builders = _builders()
    if name not in builders:
        raise TaskError(f"unknown task {name!r}; built-in tasks: {', '.join(sorted(builders))}")
    return builders[name](heldout_size=heldout_size)
