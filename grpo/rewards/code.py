"""``code_tests``: run the completion's Python against the row's tests in the sandbox.

The rule: **the untrusted process never says "pass" for a test we can check
ourselves.** It only computes; the trusted parent decides.

- ``assert EXPR == LITERAL`` (either side; the literal is anything
  ``ast.literal_eval`` reads and is plain data): the sandbox receives EXPR's
  source only, evaluates it after running the solution, and returns the value
  as plain data (JSON: None, bool, int, float, str, list, and tagged tuple,
  set and dict). Any other type (a subclass of int, an object with a lying
  ``__eq__``) is a failure. The parent compares it with the literal, which
  never enters the sandbox, with *type-strict* equality: bool is not int,
  1 is not 1.0, a tuple is not a list, recursively; float values compare
  exactly, as ``==`` does.
- stdin/stdout cases (a row's ``inputs`` and ``outputs``: lists of strings,
  or the JSON text of such lists): the program runs once per input with that
  text as stdin; what it prints comes back, and the parent compares it with
  the expected output (lines stripped of trailing whitespace, leading and
  trailing blank lines ignored). The expected output never enters the sandbox.
- any other assert (``assert f(x)``, ``assert abs(f(x) - y) < 1e-9``, ``assert
  f(x) == y`` with ``y`` a name): it runs inside the sandbox as the code's own
  process reports it, tagged with a nonce and trusted only if the run reaches
  its end. These are *forgeable* (code can find the nonce in its own process);
  ``grpo check-reward --reward code_tests`` counts them.
- other top-level statements of ``tests`` (imports, helpers) are setup run in
  order before the tests after them; a failing setup fails the rest.

Results are read in order from a stream only the harness is meant to write;
code that writes to it can only supply values of its own, which is what
returning them would do. A crash, timeout or early exit (``os._exit``)
scores what the parent had verified up to then.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from grpo.rewards.sandbox import Limits
from grpo.rewards.sandbox_run import run_python

# Address space is per process, and there is no cgroup: the worst case is max_processes * memory_mb (4 GB).
DEFAULT_LIMITS = Limits(wall_seconds=6.0, cpu_seconds=4, memory_mb=512, max_processes=8, output_bytes=1_000_000)

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Case:
    """One step of a row's tests. ``source`` is all the sandbox ever sees of it.

    kind: "setup" (a statement), "checked" (source is an expression; ``expected`` the literal),
    "io" (source is the stdin; ``expected`` the stdout), "opaque" (an assert run as is: forgeable).
    """

    kind: str
    source: str
    expected: object = None


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    forgeable: int  # of total: tests whose pass the sandboxed process reports itself
    output: str  # the raw result stream, for audits


# Runs in the sandbox. Results go to a saved copy of fd 1; the code's own fd 1 and 2 go to /dev/null.
_HARNESS = r'''
import io, json, os, sys
_out = os.dup(1)
_null = os.open(os.devnull, os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
sys.stdout = sys.stderr = io.StringIO()
def _emit(record):
    os.write(_out, (json.dumps(record) + "\n").encode())
def _enc(v, depth=0):
    t = type(v)
    if depth > 100:
        raise TypeError("nested too deep")
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is list:
        return [_enc(x, depth + 1) for x in v]
    if t is tuple:
        return {"tuple": [_enc(x, depth + 1) for x in v]}
    if t is set:
        return {"set": [_enc(x, depth + 1) for x in v]}
    if t is dict:
        return {"dict": [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in v.items()]}
    raise TypeError("not plain data")
def _value(i, compute):
    try:
        _emit({"i": i, "v": _enc(compute())})
    except BaseException:
        _emit({"i": i, "error": 1})
def _run_io(stdin):
    # text streams with a .buffer, as real stdin/stdout have (sys.stdin.buffer.readline(), .buffer.write())
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    raw = io.BytesIO()
    sys.stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    try:
        exec(_program, {"__name__": "__main__"})
    except SystemExit:
        pass
    sys.stdout.flush()
    return raw.getvalue().decode("utf-8", errors="replace")
import builtins
builtins.exit = builtins.quit = sys.exit  # python -S leaves them out; honest scripts call exit()
_nonce, _code, _steps = NONCE, CODE, STEPS
_g = {"__name__": "__main__"}
try:
    _program = compile(_code, "solution.py", "exec")
    if not any(k == "io" for k, _, _ in _steps):
        exec(_program, _g)
except BaseException:
    _steps = []  # the code itself failed: no test can pass
for _kind, _i, _src in _steps:
    if _kind == "setup":
        try:
            exec(compile(_src, "tests.py", "exec"), _g)
        except BaseException:
            break  # the remaining tests cannot run
    elif _kind == "checked":
        _value(_i, lambda: eval(compile(_src, "tests.py", "eval"), _g))
    elif _kind == "io":
        _value(_i, lambda: _run_io(_src))
    else:
        try:
            exec(compile(_src, "tests.py", "exec"), _g)
            _emit({"i": _i, "pass": _nonce})
        except BaseException:
            pass
_emit({"done": _nonce})
'''


def extract_code(completion: str) -> str:
    """The Python in a completion: its fenced code blocks joined, or the whole text if it has none."""
    blocks = _FENCE.findall(completion)
    return "\n\n".join(blocks) if blocks else completion


def _is_plain(value: object) -> bool:
    """Is ``value`` made only of the types the sandbox can return (see the module docstring)?"""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple, set):
        return all(_is_plain(x) for x in value)
    if type(value) is dict:
        return all(_is_plain(k) and _is_plain(x) for k, x in value.items())
    return False


def _literal(node: ast.expr) -> tuple[bool, object]:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    return _is_plain(value), value


def _classify(node: ast.stmt, source: str) -> Case:
    """A top-level statement of the tests as a Case (see the module docstring for the shapes)."""
    text = ast.get_source_segment(source, node) or ""
    if not isinstance(node, ast.Assert):
        return Case("setup", text)
    check = node.test
    if isinstance(check, ast.Compare) and len(check.ops) == 1 and isinstance(check.ops[0], ast.Eq):
        left, right = check.left, check.comparators[0]
        for expr, lit in ((left, right), (right, left)):
            ok, expected = _literal(lit)
            # a comparison inside the expression ("(f(1) == 4) == True") would run on the code's own
            # objects, whose __eq__ may lie: such a test is the sandbox's verdict, so forgeable
            if ok and not any(isinstance(n, ast.Compare) for n in ast.walk(expr)):
                return Case("checked", ast.get_source_segment(source, expr) or "", expected)
    return Case("opaque", text)


def split_tests(tests: str | Sequence[str]) -> list[Case]:
    """The row's tests, one Case per top-level statement (a list: one test per item)."""
    if isinstance(tests, str):
        return [_classify(node, tests) for node in ast.parse(tests).body]
    out = []
    for item in tests:
        body = ast.parse(item).body
        if len(body) == 1 and isinstance(body[0], ast.Assert):
            out.append(_classify(body[0], item))
        else:
            out.append(Case("opaque", item))
    return out


def io_tests(inputs: Sequence[str], outputs: Sequence[str]) -> list[Case]:
    """stdin/stdout cases as Tests."""
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
    return [Case("io", str(i), str(o)) for i, o in zip(inputs, outputs, strict=True)]


def decode(value: object) -> object:
    """The Python value of one result as the sandbox encoded it; ValueError for anything else."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [decode(x) for x in value]
    if type(value) is dict and len(value) == 1:
        ((tag, items),) = value.items()
        if type(items) is list and tag == "tuple":
            return tuple(decode(x) for x in items)
        if type(items) is list and tag == "set":
            return {decode(x) for x in items}
        if type(items) is list and tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
            return {decode(k): decode(x) for k, x in items}
    raise ValueError("not a result the sandbox writes")


def _keyed(items: object) -> dict:
    """Elements keyed by (type, value), so that 1, 1.0 and True stay apart."""
    return {(type(k), k): v for k, v in items}


def same(got: object, expected: object) -> bool:
    """Type-strict equality of plain data: the types match at every level, and the values are equal."""
    if type(got) is not type(expected):
        return False
    if type(got) in (list, tuple):
        return len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected, strict=False))
    if type(got) is dict:
        mine, theirs = _keyed(got.items()), _keyed(expected.items())
        return mine.keys() == theirs.keys() and all(same(v, theirs[k]) for k, v in mine.items())
    if type(got) is set:
        return _keyed((x, None) for x in got).keys() == _keyed((x, None) for x in expected).keys()
    if type(got) is float and math.isnan(got):
        return False
    return got == expected


def _normal_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def _passes(test: Case, record: dict, nonce: str, done: bool) -> bool:
    if test.kind == "opaque":
        return done and record.get("pass") == nonce
    if "v" not in record:
        return False
    try:
        got = decode(record["v"])
    except (ValueError, TypeError, RecursionError):
        return False
    if test.kind == "io":
        return type(got) is str and _normal_output(got) == _normal_output(str(test.expected))
    return same(got, test.expected)


def _records(output: str, nonce: str) -> tuple[dict[int, dict], bool]:
    """The first record per test index in the result stream, and whether the run reached its end."""
    records: dict[int, dict] = {}
    done = False
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(record) is not dict:
            continue
        done = done or record.get("done") == nonce
        index = record.get("i")
        if type(index) is int and index not in records:
            records[index] = record
    return records, done


def program_for(code: str, tests: Sequence[Case], nonce: str) -> tuple[str, list[Case]]:
    """(the harness source, the graded tests in index order): what the sandbox runs, without expected values."""
    graded = [t for t in tests if t.kind != "setup"]
    steps, n = [], 0
    for t in tests:
        steps.append((t.kind, -1 if t.kind == "setup" else n, t.source))
        n += t.kind != "setup"
    source = _HARNESS.replace("NONCE, CODE, STEPS", f"{nonce!r}, {code!r}, {steps!r}")
    return source, graded


def evaluate(code: str, tests: Sequence[Case], limits: Limits = DEFAULT_LIMITS, *, mode: str | None = None) -> Verdict:
    """Run ``code`` against ``tests`` in the sandbox and decide each verdict here, outside it."""
    nonce = secrets.token_hex(16)
    program, graded = program_for(code, tests, nonce)
    output = run_python(program, limits, mode=mode).stdout
    records, done = _records(output, nonce)
    passed = sum(_passes(t, records[i], nonce, done) for i, t in enumerate(graded) if i in records)
    forgeable = sum(t.kind == "opaque" for t in graded)
    return Verdict(passed, len(graded), forgeable, output)


def run_tests(code: str, tests: str | list[str], limits: Limits = DEFAULT_LIMITS, *, mode: str | None = None) -> tuple[int, int]:
    """(tests passed, tests in total) of ``code`` against assert ``tests``, in the sandbox."""
    verdict = evaluate(code, split_tests(tests), limits, mode=mode)
    return verdict.passed, verdict.total


def _json_list(value: object) -> object:
    if isinstance(value, str) and value.lstrip().startswith("["):
        return json.loads(value)  # a JSON list, as CSV cells hold them
    return value


def row_tests(example: Mapping) -> list[Case]:
    """The row's tests: its ``tests`` asserts and/or its ``inputs``/``outputs`` cases."""
    tests = split_tests(_json_list(example["tests"])) if example.get("tests") else []
    if example.get("inputs") is not None and example.get("outputs") is not None:
        tests += io_tests(_json_list(example["inputs"]), _json_list(example["outputs"]))
    return tests


def code_tests(completion: str, example: Mapping) -> float:
    """Fraction of the row's tests the completion's code passes, run in the sandbox."""
    verdict = evaluate(extract_code(completion), row_tests(example))
    return verdict.passed / verdict.total if verdict.total else 0.0


def code_tests_all(completion: str, example: Mapping) -> float:
    """``code_tests`` all-or-nothing: 1.0 only when every test passes."""
    verdict = evaluate(extract_code(completion), row_tests(example))
    return float(verdict.total > 0 and verdict.passed == verdict.total)


code_tests.reads = code_tests_all.reads = "tests"  # the row field they score by (grpo.tasks.all_answered)


code_tests.needs_sandbox = True  # type: ignore[attr-defined]
code_tests_all.needs_sandbox = True  # type: ignore[attr-defined]
