"""The reference attacks must beat: the previous code reward, whose verdict came from the solution's own process.

The solution and the asserts run in one unsandboxed process; each passing assert prints a
"pass" line tagged with a random nonce, and the run counts only if it prints the "done" line.
"""

import secrets

from grpo.rewards.sandbox import Limits
from grpo.rewards.sandbox_run import run_python

IN_PROCESS_HARNESS = """
import io, os, sys
_nonce = {nonce!r}
sys.stdout = io.StringIO()
_g = {{"__name__": "__main__"}}
exec({code!r}, _g)
for _i, _src in enumerate({tests!r}):
    try:
        exec(_src, _g)
        os.write(1, f"{{_nonce}} pass {{_i}}\\n".encode())
    except Exception:
        pass
os.write(1, f"{{_nonce}} done\\n".encode())
"""


QUICK = Limits(wall_seconds=4.0)


def in_process_score(code: str, tests: str, limits: Limits = QUICK) -> float:
    """The previous design: the verdict comes from the solution's own process (the reference attacks beat)."""
    nonce = secrets.token_hex(8)
    asserts = tests.splitlines()
    lines = run_python(IN_PROCESS_HARNESS.format(nonce=nonce, code=code, tests=asserts), limits, mode="none").stdout.splitlines()
    if f"{nonce} done" not in lines:
        return 0.0
    passed = {f"{nonce} pass {i}" for i in range(len(asserts))} & set(lines)
    return len(passed) / len(asserts)
