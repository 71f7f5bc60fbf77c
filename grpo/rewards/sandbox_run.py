"""One run of a program in the sandbox (grpo/rewards/sandbox.py: the modes, bwrap's command line, the user).

:func:`run_python` starts the mode's command (bwrap, or the interpreter under weak mode's guard) with the
in-sandbox runner (``RUNNER``: the rlimits, weak mode's audit hook, then the program read from stdin), feeds
it the program, waits up to the wall-clock limit, kills what is left (strict: until the sandbox's PID
namespace is empty), and reads back its exit code and its output, capped, as a :class:`SandboxResult`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo.rewards.sandbox import (
    Limits,
    _drop_user,
    _enter_weak,
    _warn_weak,
    bwrap_command,
    check_sandbox,
    interpreter,
    sandbox_mode,
    sandbox_user,
)
from grpo.system.parent_death import die_with_parent


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


# Runs inside the sandbox as `python -I -S -c RUNNER MODE CPU AS FSIZE NPROC`; reads the program
# from stdin, sets the rlimits (inside bwrap's user namespace, so NPROC counts this sandbox only),
# and in weak mode installs the audit hook.
RUNNER = r'''
import os, resource, sys
mode, cpu, mem, fsize, nproc = sys.argv[1], *map(int, sys.argv[2:6])
src = sys.stdin.read()
sys.stdin.close()
if mode != "none":
    for kind, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize),
                        (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        resource.setrlimit(kind, (value, value))
root = os.getcwd()
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED = ("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
           "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "signal.pthread_kill", "resource.setrlimit")
PATHS = ("os.remove", "os.rmdir", "os.rename", "shutil.rmtree", "os.chmod", "os.chown", "os.symlink", "os.link",
         "os.truncate", "os.mkdir", "os.utime")
def inside(path):
    try:
        path = os.fsdecode(path)
    except TypeError:
        return False
    return os.path.realpath(os.path.join(root, path)).startswith(root + os.sep)
def hook(event, args):
    if event in BLOCKED or event.startswith(("socket.", "ctypes.", "_ctypes.")):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1] or "", args[2] or 0
        writing = any(c in mode for c in "wax+") or flags & WRITE
        if writing and not inside(args[0]) and args[0] != os.devnull:
            raise PermissionError("sandbox: writing outside the working directory")
    if event in PATHS and args and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the working directory")
if mode == "weak":
    sys.addaudithook(hook)
del hook
program = compile(src, "<sandbox>", "exec")
del src
exec(program, {"__name__": "__main__"})
'''


def _read_capped(path: Path, cap: int) -> str:
    with path.open("rb") as f:
        return f.read(cap).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _command(mode: str, limits: Limits) -> tuple[list[str], Callable[[], None] | None, Path]:
    """(argv, preexec_fn, working directory on the host) of one run in ``mode``."""
    user = sandbox_user()
    runner = [interpreter(), "-I", "-S", "-c", RUNNER, mode, str(limits.cpu_seconds),
              str(limits.memory_mb * 1024 * 1024), str(limits.file_bytes), str(limits.max_processes)]
    work = Path(tempfile.mkdtemp(prefix="grpo-sandbox-"))  # strict: only bwrap's cwd; the code sees a tmpfs
    if mode == "strict":
        return [*bwrap_command(limits), *runner], lambda: _drop_user(user), work
    if user is not None and mode == "weak":
        os.chown(work, user.uid, user.gid)
    os.chmod(work, 0o700)
    parent = os.getpid()  # weak and none: the child dies with us, as bwrap's --die-with-parent does
    if mode == "weak":
        _warn_weak()
        return runner, lambda: (_enter_weak(user), die_with_parent(parent)), work
    return [sys.executable, *runner[1:]], lambda: die_with_parent(parent), work


def _environment(mode: str, work: Path) -> dict[str, str]:
    if mode == "strict":
        return {"PATH": "/usr/bin:/bin"}  # bwrap itself; --clearenv empties the sandbox's
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
    return {**os.environ, **env} if mode == "none" else env


def _in_namespace(ns: int) -> bool:
    """Is a live process (not a zombie, which holds nothing but its PID) still in the PID namespace ``ns``?"""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != ns:
                    continue
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        return True
            except (OSError, IndexError):
                pass
    return False


def _end_namespace(info: Path) -> None:
    """Kill the sandbox's PID 1 and wait until its PID namespace is empty.

    bwrap can exit before its PID 1 has, and PID 1 can be a zombie while the
    kernel is still killing the rest; only an empty namespace means no process
    of the program's is left.
    """
    try:
        about = json.loads(info.read_text() or "{}")
        pid, ns = about["child-pid"], about["pid-namespace"]
        fd = os.pidfd_open(pid)  # names this process for good: no PID reuse race from here on
    except (OSError, ValueError, KeyError, TypeError):
        return  # bwrap never started it, or it has been reaped, which happens after its namespace empties
    try:
        if os.stat(f"/proc/{pid}/ns/pid").st_ino == ns:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)
    deadline = time.monotonic() + 5.0
    while _in_namespace(ns) and time.monotonic() < deadline:
        time.sleep(0.002)


def _wait(proc: subprocess.Popen, program: str, wall_seconds: float) -> bool:
    """Feed the program, wait up to the wall-clock limit, kill what is left; True if it timed out."""
    try:
        proc.stdin.write(program.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    try:
        proc.wait(timeout=wall_seconds)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)  # strict: bwrap (its PID 1 follows, --die-with-parent); weak: the whole group
    proc.wait()
    return timed_out


def run_python(program: str, limits: Limits = Limits(), *, mode: str | None = None) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox; never raises for anything the program does.

    ``mode``: "strict", "weak", or "none" (no protection: tests and benchmarks
    only, to show what the sandbox stops); default :func:`sandbox_mode`.
    When it returns, no process the program started is left (strict mode; weak
    mode only kills the process group).
    """
    mode = mode or sandbox_mode()
    if mode == "strict":
        check_sandbox("strict")
    argv, preexec, work = _command(mode, limits)
    logs = Path(tempfile.mkdtemp(prefix="grpo-sandbox-logs-"))  # ours, outside the child's reach
    os.chmod(logs, 0o700)
    start = time.monotonic()
    try:
        with (logs / "out").open("wb") as out, (logs / "err").open("wb") as err, (logs / "info").open("wb") as info:
            if mode == "strict":
                argv = [argv[0], "--info-fd", str(info.fileno()), *argv[1:]]
            proc = subprocess.Popen(argv, cwd=work, env=_environment(mode, work), stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, start_new_session=True, preexec_fn=preexec,
                                    pass_fds=(info.fileno(),) if mode == "strict" else ())
            timed_out = _wait(proc, program, limits.wall_seconds)
        if mode == "strict":
            _end_namespace(logs / "info")
        return SandboxResult(
            returncode=None if timed_out else proc.returncode,
            stdout=_read_capped(logs / "out", limits.output_bytes),
            stderr=_read_capped(logs / "err", limits.output_bytes),
            timed_out=timed_out,
            seconds=time.monotonic() - start,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
