"""Run untrusted Python (a model's completion) in a sandbox the operating system enforces.

Two modes; a third, ``"none"``, exists only so tests and benchmarks can show
what the sandbox prevents.

``strict`` (the default) runs the code under bubblewrap (``bwrap``, the Debian
package ``bubblewrap``) as an unprivileged user (root drops to ``nobody``
first, so no root-owned file is the sandbox's own and the process limit binds):

- new user, PID, network, IPC, UTS and mount namespaces: the code is PID 2 of
  its own PID namespace, sees only its own processes in ``/proc``, and has no
  network interface besides a loopback of its own;
- a filesystem built from nothing: ``/usr`` (and the interpreter's prefix when
  it lives elsewhere) read-only, fresh ``/dev`` (read-only: no ``/dev/shm``) and
  ``/proc``, and two small tmpfs, the only writable places, ``/work`` (the
  working directory and ``$HOME``) and ``/tmp``. No
  ``/home``, ``/root``, ``/etc`` beyond the loader cache, no dataset, no
  checkpoint: nothing of the parent's can be read or written;
- the environment cleared to PATH, HOME, TMPDIR and LANG; stdin closed; a new
  session; every process in the namespace is killed when the wall-clock limit
  ends the run (killing bwrap kills its PID namespace), or when we die;
- rlimits set before the code runs: CPU seconds, address space, file size,
  open files, no core dumps, and a process count that, being set inside the
  new user namespace, counts the sandbox's processes only.

``weak`` is the older in-process guard, for machines without bubblewrap: a
new session, rlimits, a network namespace when the kernel allows one, the
drop to ``nobody`` when root, and a Python audit hook that refuses process
creation, signals, sockets, ctypes and writes outside the working directory.
Code can defeat an audit hook from inside the interpreter (its state lives in
the same process), reads are not restricted, and a process that calls
setsid() escapes the group kill. It prints a warning once per process.

Choose the mode with :func:`set_sandbox` (``grpo train --sandbox``, ``grpo
check-reward --sandbox``) or the ``GRPO_SANDBOX`` environment variable; the
setting is process-wide, so the reward worker processes forked by the
trainer inherit it. Strict mode without a working bwrap refuses to start
(:class:`SandboxUnavailable`); it never falls back to weak silently.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from grpo.rewards.base import RewardError
from grpo.system.parent_death import die_with_parent

MODES = ("strict", "weak")
_CLONE_NEWNET = 0x40000000
_mode: str | None = None
_warned_weak = False


class SandboxUnavailable(RewardError):
    """Strict mode was asked for and bubblewrap cannot run here."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 1024
    max_processes: int = 32
    output_bytes: int = 64_000
    file_bytes: int = 10_000_000
    disk_mb: int = 64  # strict: size of each of the /work and /tmp tmpfs


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def set_sandbox(mode: str) -> None:
    """Make ``mode`` this process's (and its future children's) sandbox mode."""
    if mode not in MODES:
        raise SandboxUnavailable(f"sandbox must be one of {', '.join(MODES)}, got {mode!r}")
    global _mode
    _mode = mode
    os.environ["GRPO_SANDBOX"] = mode  # reward workers started by spawn, or subprocesses, see it too


def sandbox_mode() -> str:
    """The mode in force: :func:`set_sandbox`'s, else ``$GRPO_SANDBOX``, else strict."""
    mode = _mode or os.environ.get("GRPO_SANDBOX") or "strict"
    if mode not in MODES:
        raise SandboxUnavailable(f"GRPO_SANDBOX must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def check_sandbox(mode: str | None = None) -> str:
    """Fail now, in one line, if ``mode`` cannot run here; warn once for weak. Returns the mode."""
    mode = mode or sandbox_mode()
    if mode not in MODES:
        raise SandboxUnavailable(f"sandbox must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "strict":
        problem = bwrap_problem()
        if problem:
            raise SandboxUnavailable(
                f"code rewards run untrusted code under bubblewrap, but {problem}: install the package "
                "`bubblewrap` (apt-get install bubblewrap) or pass --sandbox weak (a weaker in-process guard)")
    else:
        _warn_weak()
    return mode


def needs_sandbox(fns: Iterable[Callable]) -> bool:
    """Does any of these rewards run untrusted code (marked ``needs_sandbox = True``)?"""
    return any(getattr(fn, "needs_sandbox", False) for fn in fns)


def _warn_weak() -> None:
    global _warned_weak
    if not _warned_weak:
        _warned_weak = True
        print("warning: --sandbox weak: untrusted code runs under an in-process guard that it can switch off; "
              "use bubblewrap (--sandbox strict) for training on code", file=sys.stderr, flush=True)


def _world_executable(path: Path) -> bool:
    """Can a user with no special rights run ``path`` (every parent directory searchable)?"""
    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


class SandboxUser(NamedTuple):
    uid: int
    gid: int


def sandbox_user() -> SandboxUser | None:
    """The unprivileged user the sandbox runs as when we are root (``nobody``, or its usual ids
    65534 where no such user is listed); None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return SandboxUser(65534, 65534)
    return SandboxUser(entry.pw_uid, entry.pw_gid)


@functools.cache
def interpreter() -> str:
    """A Python the sandbox user can execute: ours, or else a system python3 (the code needs only the stdlib)."""
    ours = Path(sys.executable).resolve()
    if sandbox_user() is None or _world_executable(ours):
        return str(ours)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if _world_executable(Path(candidate).resolve()):
            return candidate
    raise SandboxUnavailable("no Python interpreter is executable by the unprivileged user 'nobody'")


def _drop_user(user: SandboxUser | None) -> None:
    if user is not None:
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)


def _root_layout() -> list[str]:
    """bwrap arguments for a read-only /usr and the merged-/usr links (or binds) beside it."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    prefix = Path(interpreter()).resolve().parents[1]
    if not prefix.is_relative_to("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args + ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]


def bwrap_command(limits: Limits) -> list[str]:
    """The bwrap command line up to (not including) the program it runs."""
    size = str(limits.disk_mb * 1024 * 1024)
    return [
        "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        *_root_layout(), "--dev", "/dev", "--proc", "/proc",
        "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/work", "--chdir", "/work",
        "--remount-ro", "/dev", "--remount-ro", "/",  # bwrap's own tmpfs: unbounded, so not writable
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
        "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8",
    ]


@functools.cache
def bwrap_problem() -> str | None:
    """Why strict mode cannot run here (one clause), or None when it can; tried once per process."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    try:
        proc = subprocess.run([*bwrap_command(Limits()), interpreter(), "-I", "-S", "-c", "pass"],
                              capture_output=True, text=True, timeout=30,
                              preexec_fn=lambda: _drop_user(sandbox_user()))
    except (OSError, subprocess.TimeoutExpired, SandboxUnavailable) as err:
        return f"bwrap cannot run here ({err})"
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bwrap fails here ({reason}; are unprivileged user namespaces disabled?)"
    return None


def _enter_weak(user: SandboxUser | None) -> None:
    """preexec_fn of weak mode: runs in the child after fork, before exec; root-only steps first."""
    import ctypes

    try:  # a network namespace with no interfaces; needs root (or a user namespace)
        ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET)
    except Exception:
        pass  # the audit hook still refuses sockets
    _drop_user(user)


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
