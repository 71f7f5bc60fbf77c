"""Faults injected into real `grpo train` runs, one at a time: each case asserts its outcome and its bound.

docs/faults.md tables them, with the times these tests measured; the faults at a checkpoint (a signal or a
kill while one is written, a full disk) are in tests/test_faults_checkpoint.py. The runs use a tiny random model
(conftest.make_model) so that a case takes seconds; the bounds are the ones the docs promise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_model, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
SLOW_REWARD = "import time\n\ndef score(completion, example):\n    time.sleep(0.3)\n    return float('a' in completion)\n"


@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=3).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def start(cwd: Path, model: Path, *args: str, runner: tuple[str, ...] = ("-m", "grpo")) -> subprocess.Popen:
    """`grpo train` on the tiny model in a session of its own, as a terminal would hold it: a signal to
    its process group is what Ctrl-C sends. ``runner``: what python runs (a script that patches first)."""
    cmd = [sys.executable, *runner, "train", "--model", str(model), "--task", "add", "--prompts-per-step", "2",
           "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2", "--device", "cpu", "--threads", "1",
           "--no-save-model", "--no-preflight", "--no-early-stop", "--no-filter-groups", "--no-progress", "--output", "run", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_steps(run: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until metrics.jsonl holds n lines (the step-0 evaluation is the first)."""
    deadline, metrics = time.monotonic() + timeout, run / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run took no step in time"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below pid (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            kids = [int(k) for k in (task / "children").read_text().split()] if (task / "children").exists() else []
            out += kids
            todo += kids
    return out


def rank_pid(launcher: int, rank: int) -> int:
    """The worker of that rank among the launcher's descendants (its RANK in its environment: a launcher,
    `grpo train --nproc` or torchrun, has none; the workers come before their own children, which inherit it)."""
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"train" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"no worker of rank {rank} under {launcher}")


def stopped_line(err: str, signame: str) -> int:
    """The step of the one line that says the run stopped, and where its checkpoint is."""
    lines = [line for line in err.splitlines() if f"stopped by {signame} after step" in line]
    assert len(lines) == 1, err[-3000:]
    step = int(re.search(r"after step (\d+)", lines[0]).group(1))
    assert f"latest checkpoint: run/checkpoints/step-{step:08d}" in lines[0], lines[0]
    return step


def test_sigint_to_one_rank_of_two_stops_both_after_the_same_step(tmp_path, tiny_model_dir):
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    proc = start(tmp_path, tiny_model_dir, "--nproc", "2", "--steps", "1000", "--rewards", "slow.py:score")
    try:
        wait_for_steps(tmp_path / "run", 2, proc)
        os.kill(rank_pid(proc.pid, 1), signal.SIGINT)  # rank 1 alone: rank 0 never sees a signal
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"fault: SIGINT to rank 1 of 2 -> both stopped in {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 130, err[-3000:]
    step = stopped_line(err, "SIGINT")
    logged = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == step + 1  # steps 1..step and the step-0 evaluation: no rank took another step
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()


def test_ctrl_c_under_nproc_2_rank_0_alone_speaks_without_a_traceback(tmp_path, tiny_model_dir):
    (tmp_path / "slow.py").write_text(SLOW_REWARD)
    proc = start(tmp_path, tiny_model_dir, "--nproc", "2", "--steps", "1000", "--rewards", "slow.py:score")
    try:
        wait_for_steps(tmp_path / "run", 2, proc)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does at Ctrl-C: every process of the group
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"fault: Ctrl-C under --nproc 2 -> stopped in {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 130, err[-3000:]
    step = stopped_line(err, "SIGINT")
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:08d}").is_dir()
    assert "no checkpoint was written" not in err and "Traceback" not in err and "SignalException" not in err, err
    assert err.count("SIGINT: finishing the current step") == 1, err


def run(cwd: Path, model: Path, *args: str, timeout: float = 300, runner: tuple[str, ...] = ("-m", "grpo")
        ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """A whole tiny run through the CLI; its result and metrics.jsonl's lines."""
    proc = start(cwd, model, *args, runner=runner)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    metrics = cwd / "run" / "metrics.jsonl"
    return done, [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


ONCE = """import os, signal, time

def once(name):
    '''True for the first call of the run only (a file marks it), whatever process makes it.'''
    try:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
"""


def test_a_reward_worker_killed_is_replaced_and_its_row_counted_errored(tmp_path, tiny_model_dir):
    (tmp_path / "fault.py").write_text(ONCE + "\ndef score(completion, example):\n"
                                       "    if once('killed'):\n        os.kill(os.getpid(), signal.SIGKILL)\n"
                                       "    return float('a' in completion)\n")
    done, metrics = run(tmp_path, tiny_model_dir, "--steps", "3", "--rewards", "fault.py:score")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [m for m in metrics if "optimizer_steps" in m]
    print(f"fault: a reward worker SIGKILLed in a call -> step 1 took {steps[0]['time_step']:.1f} s, "
          f"steps 2 and 3 {steps[1]['time_step']:.1f} and {steps[2]['time_step']:.1f} s")
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert steps[0]["reward_errors/score"] == 1 and steps[0]["errored/reward"] == 1, steps[0]
    assert all(m["reward_errors/score"] == 0 for m in steps[1:])  # its replacement scores the later steps
    assert "reward worker process died during the call" in done.stderr


def test_a_reward_that_hangs_counts_as_a_timeout_within_the_limit(tmp_path, tiny_model_dir):
    (tmp_path / "fault.py").write_text(ONCE + "\ndef score(completion, example):\n"
                                       "    if once('hung'):\n        time.sleep(3600)\n"
                                       "    return float('a' in completion)\n")
    done, metrics = run(tmp_path, tiny_model_dir, "--steps", "2", "--rewards", "fault.py:score", "--reward-timeout", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    first = next(m for m in metrics if m["step"] == 1)
    print(f"fault: a reward that hangs (--reward-timeout 2) -> step 1 took {first['time_step']:.1f} s")
    assert first["reward_timeouts/score"] == 1 and first["errored/reward"] == 1, first
    assert first["time_step"] < 2 + 10


SANDBOXED_FOREVER = ONCE + """
from grpo.rewards.sandbox import Limits
from grpo.rewards.sandbox_run import run_python

def score(completion, example):
    # a sandboxed program that sleeps ten minutes: under bwrap the first call, weak the others
    mode = 'strict' if once('strict') else 'weak'
    open(f'called-{mode}-{os.getpid()}', 'w').close()
    run_python('import time\\ntime.sleep(600)', Limits(wall_seconds=600), mode=mode)
    return 0.0
"""


def started(pid: int) -> bytes | None:
    """The start time of a live process (not a zombie): what tells it from a later one given its pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else fields[19]


def test_a_trainer_killed_outright_leaves_no_worker_or_sandbox_behind(tmp_path, tiny_model_dir):
    (tmp_path / "forever.py").write_text(SANDBOXED_FOREVER)
    proc = start(tmp_path, tiny_model_dir, "--steps", "2", "--rewards", "forever.py:score",
                 "--reward-timeout", "600")
    kids: dict[int, bytes] = {}
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("called-*"))) < 2:  # both reward workers are in a sandboxed call
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the rewards were never called"
            time.sleep(0.05)
        time.sleep(1.0)  # the sandboxes start their programs
        kids = {pid: t for pid in descendants(proc.pid) if (t := started(pid)) is not None}
        names = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in kids]
        assert any(n.startswith(b"bwrap") for n in names) and len(kids) >= 5, names  # forker, 2 workers, 2 runs
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait()  # not communicate(): a survivor holds its copy of the pipes open
        left = list(kids)
        while left and time.monotonic() < killed + 5:
            left = [pid for pid in left if started(pid) == kids[pid]]
            time.sleep(0.05)
        print(f"fault: the trainer SIGKILLed -> its {len(kids)} descendants gone in {time.monotonic() - killed:.1f} s")
        assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()
        for pid, t in kids.items():  # the weak sandboxes run in sessions of their own: killpg misses them
            if started(pid) == t:
                os.kill(pid, signal.SIGKILL)

HANGING_ENV = ONCE + '''
from pathlib import Path


class Hangs:
    """Says the prompt; its first step in training (after the step-0 evaluation is logged) never returns."""

    def reset(self, example, seed):
        return [{"role": "user", "content": str(example["prompt"])}]

    def step(self, messages):
        if Path("run/metrics.jsonl").exists() and once("hung"):
            time.sleep(3600)
        return [{"role": "user", "content": "go on"}], 0.0, False
'''


def test_an_environment_step_that_hangs_ends_its_episode_as_errored_within_the_limit(tmp_path, tiny_model_dir):
    (tmp_path / "env.py").write_text(HANGING_ENV)
    # the random model's turns must end for the environment to step: every letter and digit stops one
    letters = [c for c in string.ascii_letters + string.digits]
    done, metrics = run(tmp_path, tiny_model_dir, "--steps", "2", "--env", "env.py:Hangs", "--env-timeout", "2",
                        "--max-turns", "2", "--stop", *letters)
    assert done.returncode == 0, done.stderr[-3000:]
    first = next(m for m in metrics if m["step"] == 1)
    print(f"fault: an environment step that hangs (--env-timeout 2) -> step 1 took {first['time_step']:.1f} s")
    assert first["errored/environment"] == 1 and first["env_errors"] == 1, first
    assert first["time_step"] < 2 + 10
    assert "ran past 2 s (env_timeout)" in done.stderr


def vllm_python() -> str | None:
    """The Python with vLLM the vLLM tests use (tests/test_combinations.py), or None."""
    own = ROOT / ".venv-vllm" / "bin" / "python"  # this checkout's (make vllm), else GRPO_VLLM_PYTHON's
    return str(own) if own.is_file() else os.environ.get("GRPO_VLLM_PYTHON") or None


@pytest.mark.vllm
def test_the_vllm_worker_killed_mid_run_ends_it_in_one_line_naming_the_worker(tmp_path):
    python = vllm_python()
    if python is None:
        pytest.skip("no .venv-vllm in this checkout and no GRPO_VLLM_PYTHON: make vllm")
    tokenizer = make_tokenizer()  # vLLM's CPU attention takes head sizes of 32 and up: 4 heads of 32
    make_model(len(tokenizer), seed=3, hidden=128).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    proc = start(tmp_path, tmp_path / "tiny", "--engine", "vllm", "--vllm-python", python, "--steps", "1000",
                 "--eval-every", "-1")
    try:
        wait_for_steps(tmp_path / "run", 2, proc, timeout=900)  # vLLM's start on the CPU: a minute or more
        worker = next(pid for pid in descendants(proc.pid)
                      if b"grpo_vllm_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - killed
    print(f"fault: the vLLM worker SIGKILLed mid-run -> the run ended in {seconds:.1f} s")
    named = [line for line in err.splitlines() if f"vLLM worker (pid {worker})" in line]
    assert proc.returncode not in (0, None) and len(named) == 1 and "Traceback" not in err, err[-3000:]
    assert "killed by SIGKILL" in named[0] and seconds < 60, (named, seconds)


# a trainer (this program) that starts a stand-in for the vLLM worker as vllm_engine.py does, in a session of
# its own; the stand-in starts a process of its group, as vLLM starts its engine's, and watches the trainer
VLLM_TRAINER = """import os, subprocess, sys, time
worker = '''import os, subprocess, sys
sys.path.insert(0, sys.argv[2])
from grpo_vllm_worker import end_with_trainer
engine = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
print(os.getpid(), engine.pid, flush=True)
end_with_trainer(int(sys.argv[1]), every=0.05)
'''
subprocess.Popen([sys.executable, '-c', worker, str(os.getpid()), sys.argv[1]], start_new_session=True)
time.sleep(600)
"""


def test_the_vllm_worker_and_its_engine_processes_end_with_a_trainer_killed_outright():
    side = str(ROOT / "grpo" / "vllm_side")
    trainer = subprocess.Popen([sys.executable, "-c", VLLM_TRAINER, side], stdout=subprocess.PIPE, text=True)
    group: dict[int, bytes] = {}
    try:
        group = {pid: started(pid) for pid in map(int, trainer.stdout.readline().split())}
        assert len(group) == 2 and None not in group.values()
        trainer.kill()
        trainer.wait()
        killed = time.monotonic()
        deadline = killed + 5
        while any(started(pid) == t for pid, t in group.items()) and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"fault: a trainer SIGKILLed -> the vLLM worker's stand-in and its engine process gone in "
              f"{time.monotonic() - killed:.1f} s (polling every 0.05 s; the worker's default: 0.5 s)")
        assert [pid for pid, t in group.items() if started(pid) == t] == []
    finally:
        trainer.kill()
        trainer.stdout.close()
        for pid, t in group.items():
            if started(pid) == t:
                os.kill(pid, signal.SIGKILL)
