"""Worker processes that run jobs with a per-job timeout: the pool behind rewards and tools.

Workers are forked, so that any callable works, lambdas and closures
included; they never touch torch or the GPU. A worker whose job runs past
the timeout, or that dies (a reward or tool that kills its process), is
killed and replaced, and that job fails with a result the caller builds.

No worker is forked from a process that has initialised CUDA: such a
child inherits the driver's state half-way (PyTorch refuses CUDA in it) and
any lock another thread held at the fork (CUDA's, NCCL's watchdog), which
can hang it. So a pool starts one *forker* process when it is built, which
holds the job function and its arguments and forks every worker, the
replacements of a run's later timeouts included. The forker is forked from
the trainer while CUDA is not yet initialised (the trainer builds its reward
pool before it moves the model), which costs one fork per pool; otherwise it is
started as a fresh interpreter, which then needs the functions to be
importable by name (a module's function, not a lambda or a closure), and a
pool says so when they are not.

The forker and every worker end when their parent does (see
grpo.system.parent_death): a trainer that is killed outright, SIGKILL included,
leaves none of them behind, busy or not.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from typing import Generic, TypeVar

from grpo.system.parent_death import die_with_parent

R = TypeVar("R")
STOP_GRACE = 1.0  # seconds a worker has to return once asked, before it is killed


class WorkerError(RuntimeError):
    """The pool could not start its workers; the message says what to change."""


@dataclass
class _Worker:
    pid: int
    conn: Connection  # jobs out, results back; EOF once the worker is gone


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA (without importing torch when nothing has)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


class ForkPool(Generic[R]):
    """``workers`` processes, each running ``serve(conn, *args)``: it answers every ``(job, *payload)``
    it receives with ``(job, result)`` and returns when it receives None."""

    def __init__(self, serve: Callable[..., None], args: tuple, workers: int, timeout: float) -> None:
        self.timeout = timeout
        self.forker = _Forker(serve, args)
        self.workers = [self.forker.fork() for _ in range(workers)]
        # also at interpreter exit, before multiprocessing's own exit handler (atexit runs the latest first;
        # the Pipe above imported it): that handler terminates and joins, and the processes ignore SIGTERM
        self._stop = functools.partial(_stop_pool, self.forker, self.workers)
        atexit.register(self._stop)

    def _replace(self, i: int) -> None:
        self.forker.kill(self.workers[i].pid)
        self.workers[i].conn.close()
        self.workers[i] = self.forker.fork()

    def _send(self, i: int, job: tuple) -> None:
        """Give worker i a job; a worker that died while idle (a signal, the OOM killer) is replaced first."""
        try:
            self.workers[i].conn.send(job)
        except OSError:  # BrokenPipeError: its end of the pipe is gone
            self._replace(i)
            self.workers[i].conn.send(job)

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
            conns = {self.workers[i].conn: i for i in busy}
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


class _Forker:
    """The process that forks the pool's workers (see the module doc); the trainer's end of its pipe."""

    def __init__(self, serve: Callable[..., None], args: tuple) -> None:
        self.proc: mp.Process | subprocess.Popen
        if cuda_initialised():
            self.proc, self.conn = _start_fresh(serve, args)
        else:
            ctx = mp.get_context("fork")
            self.conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_forker_main, args=(child, serve, args, os.getpid()), daemon=True)
            self.proc.start()
            child.close()
        try:
            if not self.conn.poll(120):
                raise WorkerError("the reward and tool workers' forker did not start in 120 s")
            self.conn.recv()  # "ready": the functions arrived (a fresh interpreter imported their modules)
        except EOFError as err:  # its error is on stderr
            raise WorkerError(_not_importable(err)) from err

    def fork(self) -> _Worker:
        self.conn.send(("fork",))
        pid = self.conn.recv()
        return _Worker(pid, Connection(reduction.recv_handle(self.conn)))

    def kill(self, pid: int) -> None:
        """Kill worker ``pid`` and wait for it (its parent, the forker, reaps it: no pid is reused meanwhile)."""
        try:
            self.conn.send(("kill", pid))
            self.conn.recv()
        except (OSError, EOFError):  # the forker is gone, and its workers were killed with it
            pass

    def end(self) -> None:
        """Wait for the forker to return (it was sent None); kill it if it has not after a few seconds."""
        if isinstance(self.proc, subprocess.Popen):
            try:
                self.proc.wait(timeout=STOP_GRACE + 5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            self.proc.join(timeout=STOP_GRACE + 5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self.conn.close()


def _start_fresh(serve: Callable[..., None], args: tuple) -> tuple[subprocess.Popen, Connection]:
    """The forker as a new interpreter (not multiprocessing's spawn or forkserver, which would run the
    user's main script again in it); ``serve`` and ``args`` travel pickled, functions by name."""
    ours, theirs = socket.socketpair()
    code = f"from grpo.system.workers import _fresh_forker; _fresh_forker({theirs.fileno()}, {os.getpid()})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), env=env)
    theirs.close()
    conn = Connection(ours.detach())
    from grpo.system.user_code import FILES

    # the user's files first: the functions they hold are pickled by name (a file loaded earlier in this
    # process and deleted since is left out: it cannot be loaded again; a function of this pool defined
    # there would not load in the new interpreter either way)
    conn.send({name: path for name, path in FILES.items() if os.path.exists(path)})
    try:
        conn.send((serve, args))
    except (pickle.PicklingError, AttributeError, TypeError) as err:  # a lambda, a closure, a local class
        proc.kill()
        proc.wait()
        raise WorkerError(_not_importable(err)) from err
    return proc, conn


def _fresh_forker(fd: int, trainer: int) -> None:
    from grpo.system.user_code import import_user_module

    die_with_parent(trainer)  # before the imports: a user's module can take long to load
    conn = Connection(fd)
    for name, path in conn.recv().items():  # under the names they were loaded by (a file's stem)
        if name not in sys.modules:
            import_user_module(path, "worker", RuntimeError)
    serve, args = conn.recv()  # imports the modules of the other functions
    _forker_main(conn, serve, args, trainer)


def _not_importable(err: BaseException) -> str:
    return ("reward and tool workers: this process has initialised CUDA, so the workers start from a fresh "
            f"interpreter, which cannot load these functions ({type(err).__name__}: {err}); define them at "
            "the top level of an importable module, build the trainer before moving anything to the GPU, or "
            "set reward_workers=0")


def _forker_main(conn: Connection, serve: Callable[..., None], args: tuple, trainer: int) -> None:
    """Fork a worker on ("fork",), kill one on ("kill", pid); on None or EOF end every worker and return.
    Killed with ``trainer``, the process that started it: a forked forker holds a copy of the trainer's
    end of the pipe, so it would never see the EOF."""
    die_with_parent(trainer)
    for sig in (signal.SIGINT, signal.SIGTERM):  # as the workers: Ctrl-C lets the trainer finish its step
        signal.signal(sig, signal.SIG_IGN)
    conn.send("ready")
    alive: set[int] = set()
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the trainer is gone
            message = None
        _reap(alive, block=False)
        if message is None:
            break
        if message[0] == "fork":
            ours, theirs = socket.socketpair()
            forker, pid = os.getpid(), os.fork()
            if pid == 0:  # the worker: never returns into this loop
                try:
                    die_with_parent(forker)  # the forker's end, with the trainer's or by a kill
                    conn.close()
                    ours.close()
                    _serve(serve, Connection(theirs.detach()), *args)
                finally:
                    os._exit(0)
            theirs.close()
            alive.add(pid)
            conn.send(pid)
            reduction.send_handle(conn, ours.fileno(), os.getppid())
            ours.close()
        elif message[0] == "kill":
            if message[1] in alive:
                os.kill(message[1], signal.SIGKILL)
                os.waitpid(message[1], 0)
                alive.discard(message[1])
            conn.send(None)
    deadline = time.monotonic() + STOP_GRACE
    while alive and time.monotonic() < deadline:
        _reap(alive, block=False)
        time.sleep(0.01)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    _reap(alive, block=True)


def _reap(alive: set[int], *, block: bool) -> None:
    """Collect the exit of every worker in ``alive`` that has ended (all of them with ``block``)."""
    for pid in list(alive):
        if os.waitpid(pid, 0 if block else os.WNOHANG)[0] == pid:
            alive.discard(pid)


def _serve(serve: Callable[..., None], conn: Connection, *args: object) -> None:
    # Ctrl-C and SIGTERM reach the whole process group: the trainer finishes its step, so its rewards and
    # tools must live on; a worker ends when it is sent None or the pipe closes (the trainer is gone)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        serve(conn, *args)
    except EOFError:
        pass


def _stop_pool(forker: _Forker, workers: list[_Worker]) -> None:
    """Ask each worker to return (None), then the forker, which kills any still alive a second later."""
    for worker in workers:
        try:
            worker.conn.send(None)
        except OSError:
            pass
        worker.conn.close()
    workers.clear()
    try:
        forker.conn.send(None)
    except OSError:
        pass
    forker.end()
