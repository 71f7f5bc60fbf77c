"""Run untrusted Python (a model's completion) in a sandboxed subprocess.

Layers, each enough for some attacks and together for the ones the tests try:

- the OS: a fresh session (so the whole process group is killed on timeout or
  after the run), rlimits on CPU time, address space, file size, open files and
  processes, a private network namespace (no interfaces, so no network) when
  the kernel allows it, stdin closed, environment replaced by a minimal one;
- the user: run as root (CI, these sessions), RLIMIT_NPROC does not bind and
  every file is writable, so the child drops to ``nobody`` before it runs the
  code; the fresh temporary directory, owned by that user, is then the only
  writable place besides world-writable ones such as /tmp (TMPDIR and HOME
  point into the directory);
- the interpreter: ``python -I`` (no PYTHON* variables, no user site) and an
  audit hook installed before the code runs that refuses process creation,
  signals, sockets, ctypes, and writes, deletions or renames outside the
  directory. Audit hooks cannot be removed from Python code.

Not covered: a process that calls setsid() escapes the group kill (the audit
hook refuses fork, and RLIMIT_NPROC bounds how many there can be), and code
that introspects the test runner in its own process could forge its report
(see ``code_tests``). A cgroup or a container would close both.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 1024
    max_processes: int = 32
    output_bytes: int = 64_000
    file_bytes: int = 10_000_000


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def _world_executable(path: Path) -> bool:
    """Can a user with no special rights run ``path`` (every parent directory searchable)?"""
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


def sandbox_user() -> pwd.struct_passwd | None:
    """The unprivileged user the child becomes when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def interpreter() -> str:
    """A Python the sandbox user can execute: ours, or else a system python3 (the code needs only the stdlib)."""
    ours = Path(sys.executable).resolve()
    if sandbox_user() is None or _world_executable(ours):
        return str(ours)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if _world_executable(Path(candidate).resolve()):
            return candidate
    raise RuntimeError("no Python interpreter is executable by the unprivileged user 'nobody'")


def _enter_sandbox(limits: Limits, user: pwd.struct_passwd | None) -> None:
    """preexec_fn: runs in the child after fork, before exec. Order matters: root-only steps first."""
    try:  # a network namespace with no interfaces; needs root (or a user namespace)
        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
    except Exception:
        pass  # the audit hook still refuses sockets
    mem = limits.memory_mb * 1024 * 1024
    for kind, value in (
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, limits.max_processes),
    ):
        resource.setrlimit(kind, (value, value))
    if user is not None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)


# Runs inside the sandbox as `python -I -c RUNNER`; reads the program from stdin.
RUNNER = r'''
import os, sys
src = sys.stdin.read()
sys.stdin.close()
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
        if writing and not inside(args[0]):
            raise PermissionError("sandbox: writing outside the working directory")
    if event in PATHS and args and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the working directory")
if sys.argv[1:] == ["guard"]:
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


def run_python(program: str, limits: Limits = Limits(), *, guard: bool = True) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox; never raises for anything the program does.

    ``guard=False`` leaves out the audit hook, so tests can check the OS layers alone.
    """
    user = sandbox_user()
    work = Path(tempfile.mkdtemp(prefix="grpo-sandbox-"))
    logs = Path(tempfile.mkdtemp(prefix="grpo-sandbox-logs-"))  # ours, outside the child's reach
    os.chmod(logs, 0o700)
    if user is not None:
        os.chown(work, user.pw_uid, user.pw_gid)
    os.chmod(work, 0o700)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
    start = time.monotonic()
    timed_out = False
    try:
        with (logs / "out").open("wb") as out, (logs / "err").open("wb") as err:
            proc = subprocess.Popen(
                [interpreter(), "-I", "-c", RUNNER, "guard" if guard else "bare"], cwd=work, env=env, stdin=subprocess.PIPE,
                stdout=out, stderr=err, start_new_session=True,
                preexec_fn=lambda: _enter_sandbox(limits, user),
            )
            try:
                proc.stdin.write(program.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc.pid)  # also children left behind by a program that exited
            proc.wait()
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
