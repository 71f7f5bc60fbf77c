"""The reward and tool workers: forked from the pool's forker, never from the trainer once CUDA is up."""

import os
import time

import pytest

import grpo.system.workers as workers
from grpo.sampling.tools import ToolBox, load_functions, parse_tool_calls
from grpo.tasks.calc import calculator

TRIPLE = '''
def triple(x: int) -> int:
    """Triple.

    Args:
        x: a number
    """
    return 3 * x
'''


def _parent(conn):
    while (job := conn.recv()) is not None:
        if job[1] == "sleep":
            time.sleep(30)
        conn.send((job[0], os.getppid()))


def test_workers_and_their_replacements_are_forked_by_the_forker_not_by_this_process():
    pool = workers.ForkPool(_parent, (), 2, timeout=0.5)
    try:
        parents = pool.map([("ppid",), ("ppid",)], lambda j, timed_out: -1)
        assert parents == [pool.forker.proc.pid] * 2 and os.getpid() not in parents
        # a job past the timeout: its worker is killed and replaced, by the forker again
        assert pool.map([("sleep",)], lambda j, timed_out: "timed out" if timed_out else "died") == ["timed out"]
        assert pool.map([("ppid",)] * 2, lambda j, timed_out: -1) == [pool.forker.proc.pid] * 2
    finally:
        pool.close()


def test_once_cuda_is_initialised_the_forker_is_a_fresh_interpreter(monkeypatch, tmp_path):
    monkeypatch.setattr(workers, "cuda_initialised", lambda: True)  # as on a GPU after model.to("cuda")
    path = tmp_path / "my_gpu_tools.py"  # a user's file: loaded again, under its name, by the new interpreter
    path.write_text(TRIPLE)
    box = ToolBox([calculator, *load_functions(f"{path}:triple")], timeout=10.0)
    try:
        calls = parse_tool_calls('<tool>calculator("6 * 7")</tool> <tool>triple(3)</tool>')
        assert [r.text for r in box.run(calls)] == ["42", "9"]
    finally:
        box.close()
    with pytest.raises(workers.WorkerError, match="define them at the top level of an importable module"):
        workers.ForkPool(_parent, (lambda x: x,), 1, timeout=1.0)  # a lambda cannot reach a new interpreter
