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
One run of a program in a mode, its output read back: grpo/rewards/sandbox_run.py.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from grpo.rewards.base import RewardError

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
