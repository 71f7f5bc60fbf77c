"""Tasks: prompts with verifiable answers, split into disjoint train and held-out sets."""

from grpo.tasks.base import Task, TaskError, get_task, list_tasks

__all__ = ["Task", "TaskError", "get_task", "list_tasks"]
