"""``code_tests``: run the completion's Python against the row's asserts in the sandbox.

Each top-level ``assert`` in ``example['tests']`` is one test; other top-level
statements (imports, helpers) are setup run in order. The harness reports
each passing test on the real stdout, tagged with a random nonce the code
cannot predict, and ends with a "done" line; the completion's own prints go
to a buffer. A run that does not reach "done" (``os._exit`` inside a test,
a crash, a timeout, a kill) scores 0 whatever it printed before.

Known limit: the code runs in the harness's process, so code written to
find the nonce in memory, or objects whose ``__eq__`` always returns True,
could still forge passes. The sandbox bounds the damage, not this.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Mapping

from grpo.rewards.sandbox import Limits, run_python

DEFAULT_LIMITS = Limits(wall_seconds=6.0, cpu_seconds=4, memory_mb=1024, max_processes=32)

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

_HARNESS = """
import io, os, sys
def _emit(line):
    os.write(1, (line + "\\n").encode())
_nonce, _code, _steps = {nonce!r}, {code!r}, {steps!r}
sys.stdout = sys.stderr = io.StringIO()
_g = {{"__name__": "__main__"}}
try:
    exec(compile(_code, "solution.py", "exec"), _g)
except BaseException:
    _steps = []  # the code itself failed: no test can pass
for _i, _src in _steps:
    try:
        exec(compile(_src, "tests.py", "exec"), _g)
    except BaseException:
        if _i < 0:
            break  # setup failed: the remaining tests cannot run
        continue
    if _i >= 0:
        _emit(_nonce + " pass " + str(_i))
_emit(_nonce + " done")
"""


def extract_code(completion: str) -> str:
    """The Python in a completion: its fenced code blocks joined, or the whole text if it has none."""
    blocks = _FENCE.findall(completion)
    return "\n\n".join(blocks) if blocks else completion


def split_tests(tests: str | list[str]) -> list[tuple[int, str]]:
    """(index, source) per top-level statement; asserts get test indices 0..n-1, setup gets -1."""
    if isinstance(tests, list):
        return list(enumerate(tests))
    steps, n = [], 0
    for node in ast.parse(tests).body:
        source = ast.get_source_segment(tests, node) or ""
        if isinstance(node, ast.Assert):
            steps.append((n, source))
            n += 1
        else:
            steps.append((-1, source))
    return steps


def run_tests(code: str, tests: str | list[str], limits: Limits = DEFAULT_LIMITS) -> tuple[int, int]:
    """(tests passed, tests in total) of ``code`` against ``tests``, in the sandbox."""
    steps = split_tests(tests)
    total = sum(i >= 0 for i, _ in steps)
    nonce = secrets.token_hex(16)
    result = run_python(_HARNESS.format(nonce=nonce, code=code, steps=steps), limits)
    lines = result.stdout.splitlines()
    if result.timed_out or f"{nonce} done" not in lines:
        return 0, total
    passed = {line.rsplit(" ", 1)[1] for line in lines if line.startswith(f"{nonce} pass ")}
    return len(passed & {str(i) for i in range(total)}), total


def _tests_of(example: Mapping) -> str | list[str]:
    tests = example["tests"]
    if isinstance(tests, str) and tests.lstrip().startswith("["):
        tests = json.loads(tests)  # a JSON list of asserts, as CSV cells hold them
    return tests


def code_tests(completion: str, example: Mapping) -> float:
    """Fraction of ``example['tests']`` asserts the completion's code passes, run in the sandbox."""
    passed, total = run_tests(extract_code(completion), _tests_of(example))
    return passed / total if total else 0.0


def code_tests_all(completion: str, example: Mapping) -> float:
    """``code_tests`` all-or-nothing: 1.0 only when every assert passes."""
    passed, total = run_tests(extract_code(completion), _tests_of(example))
    return float(total > 0 and passed == total)
