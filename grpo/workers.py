"""Forked worker processes that run jobs with a per-job timeout: the pool behind rewards and tools.

Fork (not spawn) so that any callable works, lambdas and closures included;
the workers never touch torch or the GPU. A worker whose job runs past the
timeout, or that dies (a reward or tool that kills its process), is killed
and replaced, and that job fails with a result the caller builds.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Generic, TypeVar

R = TypeVar("R")


class ForkPool(Generic[R]):
    """``workers`` processes, each running ``serve(conn, *args)``: it answers every ``(job, *payload)``
    it receives with ``(job, result)`` and returns when it receives None."""

    def __init__(self, serve: Callable[..., None], args: tuple, workers: int, timeout: float) -> None:
        self.serve, self.args, self.timeout = serve, args, timeout
        self.ctx = mp.get_context("fork")
        self.workers = [self._start() for _ in range(workers)]
        # also at interpreter exit, before multiprocessing's own exit handler (atexit runs the latest first;
        # the Pipe above imported it): that handler terminates and joins, and the workers ignore SIGTERM
        self._stop = functools.partial(_stop_workers, self.workers)
        atexit.register(self._stop)

    def _start(self) -> tuple[mp.Process, Connection]:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(self.serve, child, *self.args), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def _replace(self, i: int) -> None:
        proc, conn = self.workers[i]
        proc.kill()
        proc.join()
        conn.close()
        self.workers[i] = self._start()

    def _send(self, i: int, job: tuple) -> None:
        """Give worker i a job; a worker that died while idle (a signal, the OOM killer) is replaced first."""
        try:
            self.workers[i][1].send(job)
        except OSError:  # BrokenPipeError: its end of the pipe is gone
            self._replace(i)
            self.workers[i][1].send(job)

    def map(self, jobs: Sequence[tuple], failed: Callable[[int, bool], R]) -> list[R]:
        """Each job's result, in job order. A job whose worker dies gets ``failed(job, False)``; one that
        runs past the timeout gets ``failed(job, True)``."""
        results: list[R | None] = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker -> (job, deadline)
        while todo or busy:
            for i in range(len(self.workers)):
                if i not in busy and todo:
                    j = todo.pop()
                    self._send(i, (j, *jobs[j]))
                    busy[i] = (j, time.monotonic() + self.timeout)
            conns = {self.workers[i][1]: i for i in busy}
            deadline = min(d for _, d in busy.values())
            for conn in wait(list(conns), timeout=max(0.0, deadline - time.monotonic())):
                i = conns[conn]
                try:
                    j, result = conn.recv()
                except (EOFError, OSError):  # the job killed its worker
                    j, result = busy[i][0], failed(busy[i][0], False)
                    self._replace(i)
                results[j] = result
                del busy[i]
            now = time.monotonic()
            for i, (j, deadline) in list(busy.items()):
                if now >= deadline:
                    results[j] = failed(j, True)
                    self._replace(i)
                    del busy[i]
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self._stop()
        atexit.unregister(self._stop)


def _serve(serve: Callable[..., None], conn: Connection, *args: object) -> None:
    # Ctrl-C and SIGTERM reach the whole process group: the trainer finishes its step, so its rewards and
    # tools must live on; a worker ends when it is sent None or the pipe closes (the trainer is gone)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        serve(conn, *args)
    except EOFError:
        pass


def _stop_workers(workers: list[tuple[mp.Process, Connection]]) -> None:
    """Ask each worker to return (None), then kill any still alive a second later."""
    for proc, conn in workers:
        try:
            conn.send(None)
        except OSError:
            pass
        proc.join(timeout=1)
        if proc.is_alive():
            proc.kill()
            proc.join()
    workers.clear()
