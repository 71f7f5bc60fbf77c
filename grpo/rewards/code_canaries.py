"""The canaries the code audit plants on the trusted side, and the traces of a run it looks for.

Before the probes run: a secret in this process's environment, secret files in a fresh folder and
in ``$HOME``, a folder watched for new files, a TCP listener on 127.0.0.1, a SIGUSR1 counter (see
:mod:`grpo.rewards.code_audit`). After a run: files written outside, processes left alive,
connections received.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SECRET_VARIABLE = "GRPO_AUDIT_SECRET"


@dataclass
class Canaries:
    """What the trusted side plants before the probes run, and what it has seen of them."""

    secret: str
    secret_files: list[Path]
    outside: Path
    port: int
    pid: int
    listener: socket.socket
    received: set[str] = field(default_factory=set)
    signals: list[int] = field(default_factory=list)


@contextlib.contextmanager
def planted() -> Iterator[Canaries]:
    """Plant the canaries (environment secret, secret files, watched folder, listener, signal counter)."""
    secret = "grpo-canary-" + secrets.token_hex(12)
    files_dir, outside = Path(tempfile.mkdtemp(prefix="grpo-audit-")), Path(tempfile.mkdtemp(prefix="grpo-audit-out-"))
    folders = [files_dir, outside]
    if os.access(Path.home(), os.W_OK):  # a user without a home (nobody) gets the other canary only
        folders.append(Path(tempfile.mkdtemp(prefix=".grpo-audit-", dir=Path.home())))
    files = [folder / "id_rsa" for folder in folders if folder != outside]
    for path in files:
        path.write_text(secret)
    os.chmod(outside, 0o777)  # the weak sandbox's user must be able to write here, if anything stops it
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    canaries = Canaries(secret, files, outside, listener.getsockname()[1], os.getpid(), listener)
    previous_env = os.environ.get(SECRET_VARIABLE)
    os.environ[SECRET_VARIABLE] = secret
    main = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGUSR1, lambda *_: canaries.signals.append(1)) if main else None
    try:
        yield canaries
    finally:
        if main:
            signal.signal(signal.SIGUSR1, previous_handler)
        _restore_env(previous_env)
        listener.close()
        for folder in folders:
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()


def _restore_env(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(SECRET_VARIABLE, None)
    else:
        os.environ[SECRET_VARIABLE] = previous


def tokens_received(canaries: Canaries) -> set[str]:
    """Tokens sent by the connections that reached the listener (they wait in its backlog until now)."""
    while True:
        try:
            conn, _ = canaries.listener.accept()
        except OSError:  # BlockingIOError: no more
            return canaries.received
        with conn:
            conn.settimeout(1)
            try:
                canaries.received.add(conn.recv(256).decode(errors="replace") or "?")
            except OSError:
                canaries.received.add("?")


def alive_with(token: str) -> list[int]:
    """PIDs of processes whose command line holds ``token``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def written_outside(canaries: Canaries, token: str) -> list[Path]:
    """The files whose name holds ``token`` that a run wrote where it should not reach (its sandbox's
    outside). Looked for on disk, so a run killed before it could report what it wrote still leaves its trace."""
    places = [canaries.outside, Path("/tmp"), Path.home(), Path.cwd(), Path.cwd().parent, Path("/"), Path("/dev/shm"),
              Path("/dev")]
    found: list[Path] = []
    for place in dict.fromkeys(places):
        try:
            found += [place / name for name in os.listdir(place) if token in name]
        except OSError:  # a folder we may not list (a home that is not ours), or none
            pass
    return found
