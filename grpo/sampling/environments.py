"""An episode's counterpart, and how the episodes call it (grpo/sampling/episodes.py runs the episodes).

An environment (:class:`Environment`) is any class with ``reset(example, seed) -> messages``, the opening
conversation for a task row (``seed``, one per group, is optional: :func:`takes_seed`), and
``step(messages) -> (reply, reward, done)`` after each policy turn: the messages to append (None: none), a
reward for the turn (None: 0) and whether the episode is over; one instance is made per episode. Each call
runs in a thread within the run's time limit (:func:`call_within`, :class:`EnvTimeout`), since an environment
lives in the trainer's process and cannot be killed. Tools are the environment :class:`ToolEnv`, with what
the chat template renders of them (:func:`template_features`: its own tool-call format, a result's role).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from grpo.sampling.tools import ToolBox, parse_tool_calls

Messages = list[dict]


class Environment(Protocol):
    """One episode's counterpart; see the module docstring. ``seed`` is optional in an implementation:
    a reset that takes none is called with the row alone, and must then open every episode of a row
    the same way."""

    def reset(self, example: Mapping, seed: int) -> Messages: ...

    def step(self, messages: Messages) -> tuple[Messages | None, float | None, bool]: ...


class EnvTimeout(TimeoutError):
    """An environment's reset or step ran past its time limit."""


def call_within(fn: Callable, args: tuple, timeout: float) -> object:
    """fn(*args), or EnvTimeout once it has run ``timeout`` seconds.

    An environment lives in the trainer's process (it holds the episode's state), so it cannot be
    killed as a tool's worker is: the call runs in a daemon thread that a hung one is left to, and
    the episode ends as errored. What the call raises is raised here.
    """
    out: dict[str, object] = {}
    grad = torch.is_grad_enabled()  # thread-local: the call runs as it would here (under no_grad in an episode)

    def run() -> None:
        try:
            with torch.set_grad_enabled(grad):
                out["value"] = fn(*args)
        except BaseException as err:  # handed to the caller, whatever it is
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True, name=f"grpo-env-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise EnvTimeout(f"{getattr(fn, '__qualname__', fn)} ran past {timeout:g} s (env_timeout)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


class ToolEnv:
    """Tools as an environment: each policy turn's calls are run and their results come back in one
    message per call; a turn without a call ends the episode. The tools are described to the model
    in the template's own way (``tools=``) or, for templates without tools, in the system message."""

    def __init__(self, tools: ToolBox, opening: Callable[[Mapping], Messages], role: str, native: bool) -> None:
        self.tools, self.opening, self.role, self.native = tools, opening, role, native
        self.stats = {"tool_calls": 0.0, "parse_failures": 0.0, "tool_errors": 0.0, "tool_timeouts": 0.0,
                      "seconds_tools": 0.0}

    def reset(self, example: Mapping) -> Messages:
        messages = [dict(m) for m in self.opening(example)]
        if self.native:
            return messages
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.tools.describe()}"
            return messages
        return [{"role": "system", "content": self.tools.describe()}, *messages]

    def step(self, messages: Messages) -> tuple[Messages | None, float | None, bool]:
        calls = parse_tool_calls(messages[-1]["content"])
        if not calls:
            return None, None, True
        start = time.perf_counter()
        results = self.tools.run(calls)
        self.stats["seconds_tools"] += time.perf_counter() - start
        self.stats["tool_calls"] += len(calls)
        self.stats["parse_failures"] += sum(c.error is not None for c in calls)
        self.stats["tool_errors"] += sum(r.error for r in results)
        self.stats["tool_timeouts"] += sum(r.timed_out for r in results)
        return [{"role": self.role, "content": r.text} for r in results], None, False


def template_features(tokenizer: object, schemas: list[dict], template: str | None = None) -> tuple[bool, str]:
    """Whether the chat template (``template``, else the tokenizer's) renders ``tools=`` (its own call
    format), and the role its tool results take: "tool" when the template renders that role, else "user"."""
    base = [{"role": "user", "content": "u"}]
    given = {"chat_template": template} if template else {}
    plain = tokenizer.apply_chat_template(base, tokenize=False, **given)
    try:
        native = bool(schemas) and tokenizer.apply_chat_template(base, tools=schemas, tokenize=False, **given) != plain
    except Exception:
        native = False
    try:
        shown = tokenizer.apply_chat_template(
            [*base, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "MARK-7"}], tokenize=False,
            **given)
        role = "tool" if "MARK-7" in shown else "user"
    except Exception:
        role = "user"
    return native, role


def takes_seed(reset: Callable) -> bool:
    """Whether an environment's reset takes the group's seed: a ``seed`` parameter or ``**kwargs``."""
    try:
        params = inspect.signature(reset).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the row alone
        return False
    return any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params)
