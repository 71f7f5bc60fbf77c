"""Stopping a run cleanly: SIGINT or SIGTERM ask it to stop after the current step.

The trainer then writes a checkpoint, says where it is and raises
:class:`RunStopped`. A second SIGINT (or SIGTERM) stops at once with
KeyboardInterrupt, without a checkpoint: the latest one is still there.
Under several processes a signal to any one of them stops them all after
the same step (:meth:`StopRequests.agreed`).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable


class RunStopped(RuntimeError):
    """The run stopped before its last step; the message says why and where its checkpoint is."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopRequests:
    """A context that turns the first SIGINT/SIGTERM into a request checked between steps."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, announce: bool = True) -> None:
        self.received: signal.Signals | None = None
        self.announce = announce  # under several processes rank 0 alone says it (each one gets Ctrl-C)
        self._previous: dict = {}

    def agreed(self, world_max: Callable[[int], int]) -> signal.Signals | None:
        """The stop every rank acts on after this step: the largest signal number any rank received.

        ``world_max`` is the world's MAX all-reduce (``World.max``), called on every rank at the same
        step boundary, as the alarms' verdict is: one rank signalled stops them all after the same step,
        so that none enters the checkpoint's collectives while another starts a step.
        """
        number = world_max(int(self.received or 0))
        return signal.Signals(number) if number else None

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
        if not self.announce:
            return
        print(
            f"\n{self.received.name}: finishing the current step, then writing a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr, flush=True,
        )
