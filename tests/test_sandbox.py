"""Hostile code against code_tests: every attack scores 0 and leaves no trace, and every attack is
first shown to work where the defence is missing, so that each test fails if its defence is removed.

Two references stand in for "no defence":
- ``in_process_score``: the previous design, asserts run in the solution's own process and a
  nonce-tagged "pass" line per test (what verdict attacks must beat);
- ``mode="none"``: the same harness run with no sandbox at all (what containment attacks must beat).

Every attack is bounded so that it cannot hurt the machine even where the defence failed: at most
100 short-lived processes, 1 GB of memory, 64 MB of files, sleeps under 10 s, signals that are caught.
"""

import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from unguarded import in_process_score

from grpo.rewards.code import code_tests, evaluate, row_tests, split_tests
from grpo.rewards.code_audit import _alive_with
from grpo.rewards.sandbox import Limits
from grpo.rewards.sandbox_run import run_python

FAST = Limits(wall_seconds=4.0, cpu_seconds=2, memory_mb=512, max_processes=16, output_bytes=1_000_000, disk_mb=16)
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert 0 == add(-1, 1)"
GOOD = "def add(a, b):\n    return a + b\n"


def score(code, tests=TESTS, mode="strict"):
    verdict = evaluate(code, split_tests(tests), FAST, mode=mode)
    return verdict.passed / verdict.total


@pytest.mark.parametrize("mode", ["strict", "weak"])
def test_honest_code_scores_by_fraction_of_tests(mode):
    assert score(GOOD, mode=mode) == 1.0
    assert score("def add(a, b):\n    return 0\n", mode=mode) == pytest.approx(2 / 3)
    assert score("def add(a, b) return", mode=mode) == 0.0
    assert code_tests(f"Here you go:\n```python\n{GOOD}```", {"tests": TESTS}) == 1.0


# Verdict attacks ----------------------------------------------------------------------------

NONCE_FORGER = """
import json, os, sys
def add(a, b):
    f = sys._getframe()
    while f is not None:
        if "_nonce" in f.f_globals:
            n, out = f.f_globals["_nonce"], f.f_globals.get("_out", 1)
            for i in range(8):
                os.write(out, f"{n} pass {i}\\n".encode())
                os.write(out, (json.dumps({"i": i, "pass": n}) + "\\n").encode())
            os.write(out, f"{n} done\\n".encode())
            os.write(out, (json.dumps({"done": n}) + "\\n").encode())
            os._exit(0)
        f = f.f_back
"""


def test_verdict_forging_with_the_harness_nonce_scores_zero():
    assert in_process_score(NONCE_FORGER, TESTS) == 1.0  # the attack works where the code's process says "pass"
    assert score(NONCE_FORGER) == 0.0
    assert score(NONCE_FORGER, mode="weak") == 0.0


RICH_COMPARISON = {
    "always-equal object": "class A:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                           "    __hash__ = object.__hash__\ndef add(a, b):\n    return A()\n",
    "int subclass whose __eq__ lies": "class I(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
                                      "def add(a, b):\n    return I(7)\n",
    "list subclass whose __eq__ lies": "class L(list):\n    def __eq__(self, o): return True\n"
                                       "def add(a, b):\n    return L()\n",
    "__ne__ and __hash__ agreeing with everything": "class H:\n    __eq__ = lambda s, o: not (s != o)\n"
                                                    "    __ne__ = lambda s, o: False\n    __hash__ = lambda s: hash(0)\n"
                                                    "def add(a, b):\n    return H()\n",
}


@pytest.mark.parametrize("name", list(RICH_COMPARISON))
def test_rich_comparison_tricks_score_zero(name):
    code = RICH_COMPARISON[name]
    assert in_process_score(code, TESTS) == 1.0
    assert score(code) == 0.0


def test_str_subclass_that_lies_scores_zero():
    tests = "assert greet('a') == 'hello a'\nassert greet('b') == 'hello b'"
    code = "class S(str):\n    __eq__ = lambda s, o: True\n    __hash__ = str.__hash__\ndef greet(n):\n    return S('')\n"
    assert in_process_score(code, tests) == 1.0
    assert score(code, tests) == 0.0
    assert score("def greet(n):\n    return 'hello ' + n\n", tests) == 1.0


def test_expected_values_never_enter_the_sandbox():
    peek = ("import sys, ast\ndef add(a, b):\n    f = sys._getframe()\n    while f is not None:\n"
            "        for v in [*f.f_globals.values(), *f.f_locals.values()]:\n"
            "            for s in (v if isinstance(v, (list, tuple)) else [v]):\n"
            "                if isinstance(s, str) and f'add({a}, {b}) ==' in s:\n"
            "                    return ast.literal_eval(s.split('==')[1].strip())\n        f = f.f_back\n")
    assert in_process_score(peek, TESTS) == pytest.approx(2 / 3)  # reads its answers from the asserts beside it
    assert score(peek) == 0.0


def test_early_exit_scores_only_what_the_parent_verified():
    code = ("import os, json\ndef add(a, b):\n    if a == 0:\n"
            "        print('pass 1\\npass 2\\ndone', json.dumps({'i': 2, 'pass': True}), flush=True)\n"
            "        os._exit(0)\n    return a + b\n")
    assert score(code) == pytest.approx(1 / 3)  # add(1, 2) was verified before the exit
    assert score("import sys\ndef add(a, b):\n    sys.exit(0)\n") == 0.0


def test_harness_tampering_scores_zero():
    code = ("import builtins, json, os\njson.dumps = lambda *a, **k: '{\"i\": 0, \"pass\": true}'\n"
            "builtins.type = lambda *a: int\nbuiltins.isinstance = lambda *a: True\nreal = os.write\n"
            "os.write = lambda fd, b: real(fd, b.replace(b'error', b'pass'))\ndef add(a, b):\n    return object()\n")
    assert score(code) == 0.0


def test_comparison_is_type_strict():
    assert score("def add(a, b):\n    return float(a + b)\n") == 0.0  # 3.0 == 3 in Python, not here
    tests = "assert f() == (1, [2])\nassert g() == {'a': 1}\nassert h() == 1\nassert k() == {1, 2}"
    assert score("def f(): return (1, [2])\ndef g(): return {'a': 1}\ndef h(): return 1\ndef k(): return {2, 1}", tests) == 1.0
    assert score("def f(): return [1, [2]]\ndef g(): return {'a': True}\ndef h(): return True\ndef k(): return [1, 2]", tests) == 0.0


def test_stdin_stdout_cases_are_compared_in_the_parent():
    row = {"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20"]}
    assert evaluate("print(int(input()) * 2)", row_tests(row), FAST).passed == 2
    assert evaluate("print(int(input()) + 3)", row_tests(row), FAST).passed == 1
    assert evaluate("import sys\nsys.stdout.write('6')\nsys.exit(0)", row_tests(row), FAST).passed == 1


def test_other_assert_shapes_run_but_are_marked_forgeable():
    tests = split_tests("import math\nassert add(1, 2) == 3\nassert add(1, 2)\nx = 3\nassert add(0, 3) == x")
    assert [t.kind for t in tests] == ["setup", "checked", "opaque", "setup", "opaque"]
    verdict = evaluate(GOOD, tests, FAST)
    assert (verdict.passed, verdict.total, verdict.forgeable) == (3, 3, 2)
    assert evaluate(NONCE_FORGER, tests, FAST).passed == 2  # forgeable, as check-reward reports


# Containment attacks ------------------------------------------------------------------------


def test_the_parents_environment_is_unreadable(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2")
    leak = ("import os, glob\nprint(os.environ.get('GRPO_TEST_SECRET'))\n"
            "for p in ['/proc/1/environ', f'/proc/{os.getppid()}/environ'] + glob.glob('/proc/*/environ'):\n"
            "    try:\n        print(open(p).read())\n    except Exception as e:\n        print(e)\n")
    assert "hunter2" in run_python(leak, FAST, mode="none").stdout
    assert "hunter2" not in run_python(leak, FAST, mode="strict").stdout


def test_the_parents_files_are_unreadable(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("BEGIN PRIVATE KEY hunter2")
    secret.chmod(0o644)
    leak = f"try:\n    print(open({str(secret)!r}).read())\nexcept Exception as e:\n    print(e)\n"
    assert "hunter2" in run_python(leak, FAST, mode="none").stdout
    assert "hunter2" not in run_python(leak, FAST, mode="strict").stdout
    listing = run_python("import os\nprint(os.listdir('/'), os.path.exists('/root'), os.path.exists('/home'))", FAST)
    assert "False False" in listing.stdout


def test_writing_outside_the_working_directory_leaves_no_trace(tmp_path):
    tmp_path.chmod(0o777)
    target = tmp_path / "new.txt"
    attack = f"for p in [{str(target)!r}, '/tmp/grpo-test-trace']:\n    try:\n        open(p, 'w').write('x')\n    except Exception:\n        pass\n"
    run_python(attack, FAST, mode="none")
    assert target.exists()
    target.unlink()
    Path("/tmp/grpo-test-trace").unlink(missing_ok=True)
    run_python(attack, FAST, mode="strict")
    assert not target.exists() and not Path("/tmp/grpo-test-trace").exists()


def test_switching_off_the_in_process_guard_defeats_weak_but_not_strict(tmp_path):
    shared = Path(tempfile.mkdtemp(prefix="grpo-test-"))  # under /tmp: reachable by the weak sandbox's user
    shared.chmod(0o777)
    target = shared / "escaped.txt"
    attack = (f"import __main__\n__main__.root = '/'\n__main__.inside = lambda p: True\n"
              f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept Exception as e:\n    print(e)\n")
    run_python(attack, FAST, mode="weak")
    assert target.exists()  # the known hole of --sandbox weak, said in docs/rewards.md
    target.unlink()
    run_python(attack, FAST, mode="strict")
    assert not target.exists()
    shared.rmdir()


def test_a_detached_process_dies_with_the_run():
    token = str(secrets.randbelow(10**9)).zfill(9)
    attack = (f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv('/bin/sleep', ['sleep', '9.{token}'])\n    os._exit(0)\n")
    run_python(attack, FAST, mode="none")
    time.sleep(0.3)
    escaped = _alive_with(token)
    for pid in escaped:
        os.kill(pid, signal.SIGKILL)
    assert escaped  # setsid escapes a process-group kill
    run_python(attack, FAST, mode="strict")
    assert not _alive_with(token)


def test_no_network_even_to_a_listener_on_this_machine():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    attack = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=1)"
              f".sendall(b'hi')\nexcept Exception as e:\n    print(e)\n")
    try:
        run_python(attack, FAST, mode="none")
        server.accept()[0].close()  # it arrived
        run_python(attack, FAST, mode="strict")
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_signals_cannot_reach_the_parent():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    attack = f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}):\n    try:\n        os.kill(pid, signal.SIGUSR1)\n    except Exception:\n        pass\n"
    try:
        run_python(attack, FAST, mode="none")
        time.sleep(0.1)
        assert received
        received.clear()
        run_python(attack, FAST, mode="strict")
        time.sleep(0.1)
        assert not received
    finally:
        signal.signal(signal.SIGUSR1, previous)


FORK_BOMB = """
import os, time
made = 0
for _ in range(100):  # bounded: at most 100 children, each gone within 2 s
    try:
        pid = os.fork()
    except Exception:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    made += 1
print("forked", made, flush=True)
"""


def test_fork_bomb_is_bounded_by_the_process_limit():
    forked = run_python(FORK_BOMB, FAST, mode="none").stdout.split()
    assert forked[-1] == "100"
    result = run_python(FORK_BOMB, FAST, mode="strict")
    assert int(result.stdout.split()[-1]) < FAST.max_processes
    assert score(FORK_BOMB + GOOD) == 1.0  # the bomb ends in the sandbox; the code still runs


def test_memory_bomb_fails():
    bomb = "try:\n    b = bytearray(1024**3)\n    print('allocated')\nexcept MemoryError:\n    print('refused')\n"
    # the baseline (no sandbox) allocates the GiB: zero-filling it can outlast FAST's 4 s on a loaded machine
    roomy = dataclasses.replace(FAST, wall_seconds=60.0, cpu_seconds=30)
    assert "allocated" in run_python(bomb, roomy, mode="none").stdout
    assert "refused" in run_python(bomb, FAST, mode="strict").stdout
    assert score("x = bytearray(50 * 10**9)\n" + GOOD) == 0.0


def test_disk_bomb_stops_at_the_limits():
    bomb = ("written = 0\nfor i in range(32):\n    try:\n        with open(f'bomb{i}', 'wb') as f:\n"
            "            f.write(b'x' * 2 * 1024**2)\n        written += 2\n    except Exception:\n        pass\n"
            "print('MB', written)\n")
    assert run_python(bomb, FAST, mode="none").stdout.split()[-1] == "64"
    assert int(run_python(bomb, FAST, mode="strict").stdout.split()[-1]) <= FAST.disk_mb


def test_infinite_loop_is_killed_at_the_time_limit():
    result = run_python("while True:\n    pass\n", FAST)
    assert result.timed_out or result.returncode != 0
    assert result.seconds < FAST.wall_seconds + 2
    assert score("while True:\n    pass\n" + GOOD) == 0.0


# The same, as a user without root ----------------------------------------------------------

AS_USER = Path(__file__).with_name("sandbox_as_user.py")


def test_the_sandbox_holds_for_an_unprivileged_user():
    """As root (CI), re-run the containment battery as 'nobody' through setpriv; as a user, directly."""
    command = ["/usr/bin/python3", str(AS_USER)]
    if os.geteuid() == 0:
        command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd="/tmp",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "uid 0" not in proc.stdout and "strict failures: []" in proc.stdout, proc.stdout
    assert "none failures: [" in proc.stdout and "none failures: []" not in proc.stdout, proc.stdout
    weak = next(line for line in proc.stdout.splitlines() if line.startswith("weak failures:"))
    assert "switching off an in-process guard" in weak, proc.stdout


def test_a_comparison_inside_a_checked_expression_makes_the_test_forgeable():
    # "(add(1, 2) == 4) == True" would compare the code's own object: counted forgeable, not checked
    from grpo.rewards.code import split_tests

    kinds = [case.kind for case in split_tests("assert (add(1, 2) == 4) == True\nassert add(1, 2) == 3")]
    assert kinds == ["opaque", "checked"]


def test_honest_stdin_stdout_programs_using_buffers_and_exit_score():
    honest = "import sys\nn = int(sys.stdin.buffer.readline())\nsys.stdout.buffer.write(str(2 * n).encode())\nexit()\n"
    assert code_tests(f"```python\n{honest}```", {"tests": "", "inputs": ["3"], "outputs": ["6"]}) == 1.0
