"""The sandbox's containment battery, run by test_sandbox.py as an unprivileged user (the non-root path).

Runs under the system python3 (the user may not reach the project's venv), so it loads
grpo.rewards' sandbox, code and code_audit modules without the package's torch-importing
__init__. Prints the uid, the honest score and the failing probes in strict, weak and "none" mode;
test_sandbox.py asserts on them.
"""

import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for name, folder in (("grpo", REPO / "grpo"), ("grpo.rewards", REPO / "grpo" / "rewards")):
    package = types.ModuleType(name)
    package.__path__ = [str(folder)]
    sys.modules[name] = package

from grpo.rewards.code import DEFAULT_LIMITS, evaluate, row_tests  # noqa: E402
from grpo.rewards.code_audit import audit_code_reward  # noqa: E402

ROWS = [
    {"tests": "assert add(1, 2) == 3\nassert add(0, 0) == 0", "solution": "def add(a, b):\n    return a + b\n"},
    {"inputs": ["3\n"], "outputs": ["6\n"], "solution": "print(int(input()) * 2)\n"},
]


def main() -> int:
    print("uid", os.getuid())
    print("honest", [evaluate(r["solution"], row_tests(r), DEFAULT_LIMITS, mode="strict").passed for r in ROWS])
    strict = audit_code_reward(ROWS, mode="strict")
    print(strict.table())
    print("strict failures:", strict.failures())
    print("weak failures:", audit_code_reward(ROWS, mode="weak").failures())
    print("none failures:", audit_code_reward(ROWS, mode="none").failures())
    return 0


if __name__ == "__main__":
    sys.exit(main())
