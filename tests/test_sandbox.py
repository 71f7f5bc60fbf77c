"""Hostile completions against code_tests: each one scores 0, and the test process is unharmed.

Every attack is written to stay bounded even if the sandbox failed: the fork
bomb makes at most 300 short-lived processes, the loop is cut by the wall
limit, the writes and deletions target this test's own temporary files.
"""

import os
import socket

import pytest

from grpo.rewards.code import code_tests, run_tests
from grpo.rewards.sandbox import Limits, run_python, sandbox_user

FAST = Limits(wall_seconds=3.0, cpu_seconds=2, memory_mb=512, max_processes=16)
TESTS = "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0"
GOOD = "def add(a, b):\n    return a + b\n"


def score(code):
    passed, total = run_tests(code, TESTS, FAST)
    return passed / total


def test_honest_code_scores_by_fraction_of_asserts():
    assert score(GOOD) == 1.0
    assert score("def add(a, b):\n    return 0\n") == pytest.approx(2 / 3)  # add(0, 0) and add(-1, 1) are 0
    assert code_tests(f"Here you go:\n```python\n{GOOD}```", {"tests": TESTS}) == 1.0
    assert score("def add(a, b) return") == 0.0


def test_infinite_loop_is_killed_at_the_time_limit():
    result = run_python("while True:\n    pass\n", FAST)
    assert result.timed_out or result.returncode != 0
    assert result.seconds < FAST.wall_seconds + 2
    assert score("while True:\n    pass\n" + GOOD) == 0.0


def test_allocating_50_gb_fails():
    assert score("x = bytearray(50 * 10**9)\n" + GOOD) == 0.0


FORK_BOMB = """
import os, time
made = 0
for _ in range(300):  # bounded: at most 300 children, each gone within 3 s
    try:
        pid = os.fork()
    except Exception:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    made += 1
print("forked", made, flush=True)
"""


def test_fork_bomb_scores_zero():
    bomb = FORK_BOMB.replace("except Exception:\n        break", "except Exception:\n        raise")
    assert score(bomb + GOOD) == 0.0


@pytest.mark.skipif(sandbox_user() is None, reason="the process limit binds only after dropping root")
def test_process_limit_binds_without_the_audit_hook():
    result = run_python(FORK_BOMB, FAST, guard=False)
    forked = int(result.stdout.split()[-1]) if "forked" in result.stdout else 0
    assert forked < FAST.max_processes


def test_writing_and_deleting_outside_the_directory_fail(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    attack = (f"import os, shutil\nopen({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n"
              f"os.remove({str(victim)!r})\nshutil.rmtree({str(tmp_path)!r})\n")
    assert score(attack + GOOD) == 0.0
    run_python(attack, FAST, guard=False)  # the OS layer alone must also hold
    assert victim.read_text() == "precious"
    assert not (tmp_path / "new.txt").exists()


def test_the_parents_environment_secrets_are_unreadable(monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "hunter2")
    leak = ("import os\nprint(os.environ.get('GRPO_TEST_SECRET'))\n"
            "try:\n    print(open(f'/proc/{os.getppid()}/environ').read())\nexcept Exception as e:\n    print(e)\n")
    assert "hunter2" not in run_python(leak, FAST, guard=False).stdout
    assert score(leak + "assert os.environ['GRPO_TEST_SECRET']\n" + GOOD) == 0.0


def test_no_network_even_to_a_listener_on_this_machine():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    attack = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
              "    print('connected')\nexcept Exception as e:\n    print('refused', e)\n")
    try:
        assert "connected" not in run_python(attack, FAST, guard=False).stdout
        assert score(attack.replace("try:", "if True:").split("except")[0] + GOOD) == 0.0
    finally:
        server.close()


def test_killing_the_parent_fails_and_we_live():
    attack = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n"
    assert score(attack + GOOD) == 0.0
    run_python(attack, FAST, guard=False)
    assert os.getpid() > 0  # still here


def test_os_exit_inside_a_test_cannot_fake_success():
    fake = ("import os\ndef add(a, b):\n    print('pass 0\\npass 1\\npass 2\\ndone')\n    os._exit(0)\n")
    assert score(fake) == 0.0
    assert score("import sys\ndef add(a, b):\n    sys.exit(0)\n") == 0.0
