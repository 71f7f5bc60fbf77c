"""`grpo train --nproc N`: the same command as N processes on this machine, one process group.

Each process gets what torchrun would give it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, and OMP_NUM_THREADS=1 unless set) and joins the group through the
environment. torchrun itself is not used here, for what a user sees at Ctrl-C: its agent turns the
terminal's SIGINT into a ``SignalException`` traceback and sends the signal on to workers that the
terminal already signalled, so each gets two, and a second SIGINT stops a run at once, without its
checkpoint. (Several machines still go through torchrun: README's multi-node section.)

Here each worker runs in a session of its own (setsid, so a process group of its own too), so that
the terminal's Ctrl-C reaches this process alone, and it passes each SIGINT or SIGTERM on to every
worker once: the first stops the run after the step with a checkpoint (grpo/system/interrupt.py), a second
stops it at once. The exit status is
the workers' (rank 0's when it failed): 130 after a SIGINT, 143 after a SIGTERM.

The configuration is resolved once, here, before any worker starts: each worker reads the resolved and
amended configuration, with each value's source, from the file RESOLVED_ENV names (grpo/cli/train.py),
so a value the memory check set is the memory check's in every process, not the command line's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRACE_S = 30.0  # after one worker failed, how long the others get to notice it before they are ended
RESOLVED_ENV = "GRPO_RESOLVED_RUN"  # the file of the launching process's resolved configuration


def free_port() -> int:
    """A TCP port free on this machine now, for rank 0's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The environment torchrun's ``--standalone`` gives the worker of ``rank``."""
    return {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def exit_status(codes: list[int | None]) -> int:
    """The launcher's exit status from the workers' return codes (negative: killed by that signal):
    rank 0's when it failed, else the first failure's, else 0."""
    shell = [128 - code if code is not None and code < 0 else code or 0 for code in codes]
    return shell[0] or next((code for code in shell if code), 0)


def launch(nproc: int, argv: list[str], *, resolved: str = "") -> int:
    """Run ``python -m grpo ARGV`` as ranks 0..nproc-1; wait for all; return their exit status. ``resolved``:
    the configuration as this process resolved it (JSON), which every worker reads instead of resolving."""
    with tempfile.TemporaryDirectory(prefix="grpo-launch-") as folder:
        extra = {}
        if resolved:
            path = Path(folder) / "resolved.json"
            path.write_text(resolved, encoding="utf-8")
            extra[RESOLVED_ENV] = str(path)
        return _run_workers(nproc, argv, extra)


def _run_workers(nproc: int, argv: list[str], extra: dict[str, str]) -> int:
    port = free_port()
    # A session of its own (and so a process group: setsid) for each worker, so the terminal's Ctrl-C
    # reaches this process alone; start_new_session, unlike process_group=, runs on Python 3.10.
    procs = [subprocess.Popen([sys.executable, "-m", "grpo", *argv], env={**worker_env(rank, nproc, port), **extra},
                              start_new_session=True) for rank in range(nproc)]

    def pass_on(signum: int, frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return exit_status(wait_all(procs))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:  # only when this process itself was stopped on the way (e.g. SIGKILL is not caught)
            if proc.poll() is None:
                proc.kill()


def wait_all(procs: list[subprocess.Popen]) -> list[int | None]:
    """Wait for every worker. Once one has failed, the others (stuck, maybe, in a collective with it)
    get GRACE_S seconds to end on their own, then SIGTERM, then SIGKILL 10 s later."""
    failed_at, ending = None, [signal.SIGTERM, signal.SIGKILL]  # what the stragglers get, in turn
    while any(proc.poll() is None for proc in procs):
        if failed_at is None and any(proc.poll() not in (None, 0) for proc in procs):
            failed_at = time.monotonic()
        if ending and failed_at is not None and time.monotonic() - failed_at > GRACE_S + 10 * (2 - len(ending)):
            sig = ending.pop(0)
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(sig)
        time.sleep(0.1)
    return [proc.returncode for proc in procs]
