"""Tasks: prompts with verifiable answers, split into disjoint train and held-out sets."""

from grpo.tasks.base import Task, TaskError
from grpo.tasks.builtin import describe_tasks, get_task, list_tasks
from grpo.tasks.data import (
    DataError,
    all_answered,
    data_splits,
    dataset_task,
    describe_data,
    heldout_rows,
    load_rows,
    say_data,
    split_rows,
)


def load_task(
    task: str,
    *,
    data: str = "",
    heldout_size: int = 256,
    prompt_field: str = "",
    answer_field: str = "",
    system_prompt: str = "",
    prompt_template: str = "",
    eval_data: str = "",
    require_answer: bool = True,
    data_config: str = "",
    data_split: str = "",
    eval_config: str = "",
    eval_split: str = "",
) -> Task:
    """The built-in ``task``, or the user's ``data`` (scored by math_answer unless rewards are given);
    held out: ``eval_data``'s rows if given, else the data's test split, else a split of the training rows
    (grpo/tasks/data.py data_splits; the configurations and splits read are the config's fields)."""
    fields = {"prompt_field": prompt_field, "answer_field": answer_field, "prompt_template": prompt_template,
              "require_answer": require_answer}
    if not data:
        given = [name for name, value in (("data_config", data_config), ("data_split", data_split)) if value]
        given += [name for name, value in (("eval_config", eval_config), ("eval_split", eval_split))
                  if value and not eval_data]
        if given:
            source = "eval_data" if given[0].startswith("eval") else "data"
            raise DataError(f"{given[0]} names a part of a dataset, and no {source} is given")
        built = get_task(task, heldout_size=heldout_size)
        heldout = built.heldout
        if eval_data:
            heldout = heldout_rows(eval_data, heldout_size, config=eval_config, split=eval_split, **fields)
        return Task(built.name, built.train, heldout, built.reward, system_prompt or built.system_prompt,
                    built.defaults, built.tools, built.env)
    from grpo.rewards.math import math_answer

    return dataset_task(data, reward=math_answer, heldout_size=heldout_size, system_prompt=system_prompt,
                        eval_source=eval_data, config=data_config, split=data_split, eval_config=eval_config,
                        eval_split=eval_split, **fields)


__all__ = ["DataError", "Task", "all_answered", "TaskError", "data_splits", "dataset_task", "describe_data",
           "describe_tasks", "get_task", "heldout_rows", "list_tasks", "load_rows", "load_task", "say_data",
           "split_rows"]
