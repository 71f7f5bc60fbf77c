"""Make a child process end when its parent does, however the parent ends (SIGKILL included).

A reward worker, its forker, or a program one of them runs would otherwise
outlive a killed trainer, adopted by init, for as long as its job runs (a
hung reward: forever). Linux delivers a chosen signal to a process whose
parent dies once it has asked with ``prctl(PR_SET_PDEATHSIG)``; elsewhere this
is a no-op and the pipes' EOF remains the only way a child learns of it.

The request is made by the child, so a parent that dies before it is made
is missed: the child checks afterwards that its parent is still the one it
was forked from, and ends itself when it is not. The request is cleared by a
change of user (the sandbox's drop to ``nobody``), so it is made after one.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Ask for ``sig`` when the parent dies; if ``parent`` (its pid, taken before the fork) is already
    gone, send it now. SIGKILL by default: the workers ignore SIGINT and SIGTERM on purpose."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died between the fork and the request
        os.kill(os.getpid(), sig)
