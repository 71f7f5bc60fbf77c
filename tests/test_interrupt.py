"""The pieces of a clean stop: the ranks' agreed signal, the launcher's exit status, an environment's time limit."""

from __future__ import annotations

import signal
import time

import pytest

from grpo.sampling.environments import EnvTimeout, call_within
from grpo.system.interrupt import StopRequests
from grpo.system.launcher import exit_status, worker_env


def test_a_signal_on_any_rank_is_the_stop_every_rank_agrees_on():
    quiet, told = StopRequests(), StopRequests()
    told.received = signal.SIGINT
    ranks = [quiet, told]  # rank 0 saw nothing, rank 1 a SIGINT: the MAX over ranks is SIGINT on both
    world_max = lambda value: max(int(r.received or 0) for r in ranks)  # noqa: E731
    assert [r.agreed(world_max) for r in ranks] == [signal.SIGINT, signal.SIGINT]
    quiet.received = signal.SIGTERM  # both: the larger number, the same on every rank
    assert [r.agreed(world_max) for r in ranks] == [signal.SIGTERM, signal.SIGTERM]
    assert StopRequests().agreed(lambda value: value) is None


def test_the_launchers_exit_status_is_rank_0s_failure_else_the_first():
    assert exit_status([0, 0]) == 0
    assert exit_status([130, 130]) == 130
    assert exit_status([0, 1]) == 1
    assert exit_status([2, 1]) == 2
    assert exit_status([0, -signal.SIGKILL]) == 128 + signal.SIGKILL  # a worker killed by a signal


def test_each_worker_gets_its_rank_and_one_rendezvous():
    env = worker_env(1, 2, 29501)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "1", "2", "29501")


def test_an_environment_call_returns_raises_or_times_out_in_its_limit():
    assert call_within(lambda a, b: a + b, (1, 2), 5.0) == 3
    with pytest.raises(ValueError, match="bad"):
        call_within(lambda: (_ for _ in ()).throw(ValueError("bad")), (), 5.0)
    start = time.monotonic()
    with pytest.raises(EnvTimeout, match="ran past 0.2 s"):
        call_within(time.sleep, (30,), 0.2)
    assert time.monotonic() - start < 2


def test_once_a_worker_failed_the_others_are_ended_after_the_grace(monkeypatch):
    import subprocess
    import sys

    import grpo.system.launcher

    monkeypatch.setattr(grpo.system.launcher, "GRACE_S", 0.3)
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"]),
             subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]  # stuck, as in a collective
    start = time.monotonic()
    assert grpo.system.launcher.wait_all(procs) == [1, -signal.SIGTERM]
    assert time.monotonic() - start < 10
