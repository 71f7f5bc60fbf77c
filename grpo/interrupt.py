"""Stopping a run cleanly: SIGINT or SIGTERM ask it to stop after the current step.

The trainer then writes a checkpoint, says where it is and raises
:class:`RunStopped`. A second SIGINT (or SIGTERM) stops at once with
KeyboardInterrupt, without a checkpoint: the latest one is still there.
"""

from __future__ import annotations

import signal
import sys
import threading


class RunStopped(RuntimeError):
    """The run stopped before its last step; the message says why and where its checkpoint is."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopRequests:
    """A context that turns the first SIGINT/SIGTERM into a request checked between steps."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequests:
        # signal handlers can only be installed from the main thread (not, e.g., in a notebook worker)
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            raise KeyboardInterrupt  # the second one: stop now
        self.received = signal.Signals(signum)
        print(
            f"\n{self.received.name}: finishing the current step, then writing a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr, flush=True,
        )
