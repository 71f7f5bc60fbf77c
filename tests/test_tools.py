"""Tool calls: parsing both formats, schemas from signatures, errors as data, timeouts in worker processes."""

import time

import pytest

from grpo.sampling.tools import ToolBox, ToolCall, ToolError, load_functions, parse_tool_calls, tool_schema
from grpo.tasks.calc import calculator


def lookup(key: str, default: int = 0) -> str:
    """Look a key up.

    Args:
        key: what to look up
        default: returned when the key is unknown
    """
    return {"a": "1"}.get(key, str(default))


def sleepy(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


def broken(x: int) -> str:
    """Raise.

    Args:
        x: anything
    """
    raise KeyError(x)


def undocumented(x):
    return x


def test_both_call_formats_parse():
    native = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
    assert parse_tool_calls(native) == [ToolCall("lookup", (), {"key": "a"})]
    assert parse_tool_calls('<tool>lookup("a", default=3)</tool>') == [ToolCall("lookup", ("a",), {"default": 3})]
    assert parse_tool_calls('{"name": "lookup", "parameters": {"key": "a"}}') == [ToolCall("lookup", (), {"key": "a"})]
    assert parse_tool_calls("The answer is 7.") == []


@pytest.mark.parametrize("text", [
    "<tool_call>{not json}</tool_call>", '<tool_call>{"name": "lookup"', "<tool>lookup(</tool>",
    "<tool>lookup(__import__('os'))</tool>", "<tool>2 + 2</tool>",
])
def test_malformed_calls_are_errors_not_crashes(text):
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and calls[0].error


def test_schema_comes_from_the_signature_and_docstring():
    fn = tool_schema(lookup)["function"]
    assert fn["name"] == "lookup" and fn["parameters"]["required"] == ["key"]
    assert fn["parameters"]["properties"]["default"]["type"] == "integer"
    with pytest.raises(ToolError, match="undocumented"):
        tool_schema(undocumented)


def test_errors_go_back_to_the_model_and_timeouts_kill_the_worker():
    box = ToolBox([lookup, sleepy, broken], timeout=0.5, workers=2)
    try:
        calls = [ToolCall("lookup", ("a",)), ToolCall("nope", ()), ToolCall("lookup", (), {"key": 3}),
                 ToolCall("lookup", (), {"wrong": 1}), ToolCall("broken", (1,)), ToolCall("sleepy", (5.0,)),
                 ToolCall(error="bad tag")]
        start = time.monotonic()
        results = box.run(calls)
        assert time.monotonic() - start < 3
        assert results[0].text == "1" and not results[0].error
        assert "unknown tool 'nope'" in results[1].text
        assert "key must be str" in results[2].text
        assert "bad arguments" in results[3].text
        assert "KeyError" in results[4].text and results[4].error
        assert results[5].timed_out and "timed out" in results[5].text
        assert results[6].text == "error: bad tag"
        assert box.run([ToolCall("sleepy", (0.0,))])[0].text == "awake"  # the replaced worker serves
    finally:
        box.close()


def test_withheld_tools_are_described_but_never_run():
    box = ToolBox([calculator], withheld=True)
    assert "calculator(expression: string)" in box.describe()
    result = box.run(parse_tool_calls('<tool>calculator("2*3")</tool>'))[0]
    assert result.error and "not available" in result.text


@pytest.mark.parametrize("expression,expected", [
    ("4721 * 38", "179398"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"), ("2 ** 10", "1024"), (" 10 // 3 ", "3"),
])
def test_calculator(expression, expected):
    assert calculator(expression) == expected


@pytest.mark.parametrize("expression", ["__import__('os')", "x + 1", "9 ** 9 ** 9", "'a' * 3", "[1] * 3"])
def test_calculator_refuses_anything_but_arithmetic(expression):
    with pytest.raises((ValueError, SyntaxError)):
        calculator(expression)


def test_load_functions_from_a_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text("def f(x: int) -> int:\n    '''Double.\n\n    Args:\n        x: a number\n    '''\n    return 2 * x\n")
    (fn,) = load_functions(f"{path}:f")
    assert fn(2) == 4
    with pytest.raises(ToolError, match="'g' not found"):
        load_functions(f"{path}:g")
    with pytest.raises(ToolError, match="tool file not found: nowhere.py"):
        load_functions("nowhere.py:f")
    broken = tmp_path / "broken_tools.py"
    broken.write_text("raise RuntimeError('half-written')\n")  # a user's file that fails on import is one line
    with pytest.raises(ToolError, match="cannot import tool file .*broken_tools.py: half-written"):
        load_functions(f"{broken}:f")
    with pytest.raises(ToolError, match="cannot import environment module 'no_such_pkg_xyz'"):
        load_functions("no_such_pkg_xyz:Env", "environment")


def test_a_worker_killed_while_idle_is_replaced():
    import os
    import signal

    box = ToolBox([lookup], timeout=2.0)
    try:
        os.kill(box.pool.workers[0].pid, signal.SIGKILL)
        assert box.pool.workers[0].conn.poll(5)  # its end of the pipe closed: it is gone
        assert box.run([ToolCall("lookup", ("a",))])[0].text == "1"
    finally:
        box.close()


def test_a_process_that_never_closes_its_toolbox_still_exits():
    # a tool worker ignores SIGTERM (Ctrl-C must let the step finish), and multiprocessing's exit handler
    # terminates and joins its children: without the pool's own exit handler this process never ended
    import subprocess
    import sys

    code = ("from grpo.tasks.calc import calculator\nfrom grpo.sampling.tools import ToolBox, parse_tool_calls\n"
            "box = ToolBox([calculator])\n"
            "print(box.run(parse_tool_calls('<tool>calculator(\"6 * 7\")</tool>'))[0].text)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr


def test_the_shipped_calc_rows_are_scored_on_the_whole_expression():
    from grpo.tasks import get_task

    task = get_task("calc", heldout_size=4)
    row = task.heldout[0]
    a, b, c = (int(x) for x in row["question"].removeprefix("What is ").rstrip("?").replace("*", "+").split("+"))
    assert row["answer"] == str(a * b + c) == calculator(f"{a} * {b} + {c}")
    assert task.reward(str(a * b + c), row) == 1.0
    assert task.reward(str(a * b), row) == 0.0  # the product alone, as the example's call would give, is wrong
