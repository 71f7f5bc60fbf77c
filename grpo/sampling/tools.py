"""Tools the policy may call: plain typed Python functions, their schemas, the calls parsed out of a
turn, and their execution in worker processes with a timeout.

A tool is a function with type hints and a docstring whose ``Args:`` section
describes every argument; its JSON schema comes from
``transformers.utils.get_json_schema``. Two call formats are parsed from a
model turn:

- the model family's own, for chat templates that render ``tools=``:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>``
  (Qwen2.5/3, Hermes); a turn that is one bare JSON object with ``name`` and
  ``parameters`` (Llama 3) is read the same way;
- the plain tag format, for templates without tools (the embedded SmolLM2):
  ``<tool>calculator("2*3")</tool>`` or ``<tool>calculator(expression="2*3")</tool>``,
  a Python call with literal arguments, read with ``ast`` (never evaluated).
  The tools are described to the model in the system message.

A tag that does not parse, an unknown tool, arguments that do not fit the
signature, a tool that raises and one that runs past the timeout each give
the model an error message instead of a result, and are counted.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from grpo.config import ConfigError
from grpo.system.user_code import import_user_module
from grpo.system.workers import ForkPool

PLAIN_CALL = re.compile(r"<tool>(.*?)(</tool>|$)", re.DOTALL)
NATIVE_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MAX_RESULT_CHARS = 2000  # a tool's answer is cut to this, so one call cannot flood the context


class ToolError(ConfigError):
    """A tool or environment that cannot be used (no type hints or docstring, not found); the message names it."""


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a turn: a tool name and its keyword arguments, or why it failed to parse."""

    name: str = ""
    args: tuple = ()
    kwargs: Mapping[str, object] = field(default_factory=dict)
    error: str | None = None  # set for a malformed call


def tool_schema(fn: Callable) -> dict:
    """The function's JSON schema (OpenAI/HF tool format), read from its signature and docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # get_json_schema raises its own exception types for missing hints/docs
        name = getattr(fn, "__name__", repr(fn))
        raise ToolError(f"tool {name}: {err} (a tool needs type hints and a docstring with an Args: section)") from err


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every call in a turn, in order; malformed ones carry their ``error``. No call: an empty list."""
    calls = [_native_call(m.group(1), m.group(2)) for m in NATIVE_CALL.finditer(text)]
    calls += [_plain_call(m.group(1), m.group(2)) for m in PLAIN_CALL.finditer(text)]
    if not calls and text.strip().startswith("{") and '"name"' in text:
        calls = [_native_call(text.strip(), "bare")]
    return calls


def _native_call(body: str, closed: str) -> ToolCall:
    if not closed:
        return ToolCall(error="<tool_call> without </tool_call>")
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall(error=f"the call is not valid JSON ({err.msg})")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(error='the call must be a JSON object with "name" and "arguments"')
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(error='"arguments" must be a JSON object')
    if not isinstance(args, dict):
        return ToolCall(error='"arguments" must be a JSON object')
    return ToolCall(value["name"], (), args)


def _plain_call(body: str, closed: str) -> ToolCall:
    if not closed:
        return ToolCall(error="<tool> without </tool>")
    try:
        node = ast.parse(body.strip(), mode="eval").body
    except SyntaxError:
        return ToolCall(error="write a call as <tool>name(arguments)</tool>")
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return ToolCall(error="write a call as <tool>name(arguments)</tool>")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ToolCall(error="tool arguments must be literals (numbers, strings, lists)")
    return ToolCall(node.func.id, args, kwargs)


def _check_args(fn: Callable, call: ToolCall) -> str | None:
    """Why the arguments do not fit the function's signature and simple type hints, or None."""
    try:
        bound = inspect.signature(fn).bind(*call.args, **call.kwargs)
    except TypeError as err:
        return f"bad arguments for {call.name}: {err}"
    hints = inspect.get_annotations(fn, eval_str=True)
    for name, value in bound.arguments.items():
        kind = hints.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if kind in (str, int, float, bool) and not isinstance(value, kind):
            return f"bad arguments for {call.name}: {name} must be {kind.__name__}, got {type(value).__name__}"
    return None


@dataclass
class ToolResult:
    """What a call gave back to the model, and how it went."""

    text: str
    error: bool = False  # raised, timed out, unknown tool or bad arguments
    timed_out: bool = False


def _worker_loop(conn: Connection, fns: Sequence[Callable]) -> None:
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        job_id, k, args, kwargs = job
        try:
            conn.send((job_id, ToolResult(str(fns[k](*args, **kwargs))[:MAX_RESULT_CHARS])))
        except Exception as err:  # the tool's failure is the model's information
            conn.send((job_id, ToolResult(f"error: {type(err).__name__}: {err}"[:MAX_RESULT_CHARS], error=True)))


class ToolBox:
    """The tools of a run: their schemas, and forked worker processes that run calls with a timeout.

    A worker whose call runs past ``timeout`` is killed and replaced. With
    ``workers=0`` calls run in this process, without a timeout (tests). ``withheld``: the tools are
    described but every call gets an error (a control run: the same prompts, no results).
    """

    def __init__(self, fns: Sequence[Callable], *, timeout: float = 10.0, workers: int = 1,
                 withheld: bool = False) -> None:
        self.schemas = [tool_schema(fn) for fn in fns]
        self.fns = {} if withheld else {fn.__name__: fn for fn in fns}
        self.withheld = withheld
        self.timeout = timeout
        self.order = list(self.fns)
        self.pool: ForkPool[ToolResult] | None = (
            ForkPool(_worker_loop, (list(self.fns.values()),), workers, timeout) if workers and self.fns else None)

    def describe(self) -> str:
        """The tools in the plain tag format, for a system message (templates without tools)."""
        lines = ["You can call these tools. To call one, write <tool>name(arguments)</tool> and stop; "
                 "the result comes back in the next message."]
        for schema in self.schemas:
            fn = schema.get("function", schema)
            params = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in fn["parameters"]["properties"].items())
            lines.append(f"- {fn['name']}({params}): {fn.get('description', '')}")
        return "\n".join(lines)

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Each call's result, in order; checks the call before any worker sees it."""
        results: list[ToolResult | None] = [None] * len(calls)
        jobs = []
        for j, call in enumerate(calls):
            if call.error is not None:
                results[j] = ToolResult(f"error: {call.error}", error=True)
            elif self.withheld:
                results[j] = ToolResult(f"error: tool {call.name!r} is not available", error=True)
            elif call.name not in self.fns:
                known = ", ".join(self.order) or "none"
                results[j] = ToolResult(f"error: unknown tool {call.name!r} (tools: {known})", error=True)
            elif (problem := _check_args(self.fns[call.name], call)) is not None:
                results[j] = ToolResult(f"error: {problem}", error=True)
            else:
                jobs.append(j)
        for j, result in zip(jobs, self._execute([calls[j] for j in jobs]), strict=True):
            results[j] = result
        return results  # type: ignore[return-value]

    def _execute(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        if self.pool is None:
            out = []
            for call in calls:
                try:
                    out.append(ToolResult(str(self.fns[call.name](*call.args, **call.kwargs))[:MAX_RESULT_CHARS]))
                except Exception as err:
                    out.append(ToolResult(f"error: {type(err).__name__}: {err}", error=True))
            return out
        jobs = [(self.order.index(call.name), call.args, dict(call.kwargs)) for call in calls]

        def failed(j: int, timed_out: bool) -> ToolResult:
            if timed_out:
                return ToolResult(f"error: the tool timed out after {self.timeout:g} s", error=True, timed_out=True)
            return ToolResult("error: the tool's process died", error=True)

        return self.pool.map(jobs, failed)

    def close(self) -> None:
        """Stop the workers; later calls run in this process, without a timeout."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def load_functions(spec: str, what: str = "tool") -> list[Callable]:
    """``path/to/file.py:fn1,fn2`` (or ``module:fn1,fn2``) -> the named objects."""
    if ":" not in spec:
        raise ToolError(f"{what} {spec!r}: write it as path/to/file.py:name1,name2")
    where, names = spec.rsplit(":", 1)
    module = import_user_module(where, what, ToolError)
    found = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if not hasattr(module, name):
            raise ToolError(f"{what} {name!r} not found in {where}")
        found.append(getattr(module, name))
    if not found:
        raise ToolError(f"{what} {spec!r} names nothing after the colon")
    return found
