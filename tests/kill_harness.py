"""SIGKILL a tiny-model run at random moments, resume it each time, and check where it ends.

    python tests/kill_harness.py WORK_DIR --kills 20 --seed 0

prints one JSON line (tests/test_kill.py runs it and reads the line). A reference run goes
through uninterrupted; then runs are killed at a random moment and resumed from their latest
complete checkpoint, again and again, until the wanted number of kills; every run that
reaches its end must hold bitwise the reference's weights, metrics (but timings) and samples.

Each run is a child forked from this process after the imports: a fresh interpreter would
spend seconds importing torch per trial. This process runs no torch computation until the
last child is done, so forking is safe. Checkpoint fsyncs are slowed by 5 ms in the children
so that a good share of the kills land in the middle of writing a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_run  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402, F401  (imported before forking, not once per child)
from transformers import LlamaForCausalLM  # noqa: E402, F401

import grpo.run.checkpoint as checkpoint  # noqa: E402

STEPS = 8


def _child(run_dir: Path, resume: bool, log: Path) -> None:
    code = 1
    try:
        real_fsync = checkpoint._fsync

        def slow_fsync(fd: int) -> None:
            time.sleep(0.005)
            real_fsync(fd)

        checkpoint._fsync = slow_fsync
        trainer = tiny_run.tiny_trainer(steps=STEPS, save_every=1, keep_checkpoints=2, threads=1)
        if resume:
            with log.open("a") as f:
                f.write(f"{checkpoint.read_meta(checkpoint.latest(run_dir))['step']}\n")
        trainer.train(run_dir, resume=resume)
        code = 0
    except BaseException:
        traceback.print_exc()
    os._exit(code)


def spawn(run_dir: Path, resume: bool, log: Path) -> int:
    pid = os.fork()
    if pid == 0:
        _child(run_dir, resume, log)
    return pid


def run_to_end(run_dir: Path, log: Path) -> float:
    start = time.perf_counter()
    pid = spawn(run_dir, checkpoint.latest(run_dir) is not None, log)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"run in {run_dir} failed")
    return time.perf_counter() - start


def partial_dirs(run_dir: Path) -> list[str]:
    root = checkpoint.checkpoint_dir(run_dir)
    return [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] if root.is_dir() else []


def _wait_for_a_write(run_dir: Path, pid: int, deadline: float) -> None:
    """Until a checkpoint's temporary folder (not a pruned one's) appears, the run ends or the deadline."""
    while time.monotonic() < deadline and not any(not n.startswith(".tmp-del-") for n in partial_dirs(run_dir)):
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return  # it ended (not reaped here: the caller's waitpid sees how)
        except OSError:
            return
        time.sleep(0.0005)


def kill_trials(work: Path, kills_wanted: int, seed: int, duration: float) -> dict:
    rng = random.Random(seed)
    report = {"kills": 0, "mid_write": 0, "mid_prune": 0, "before_first_checkpoint": 0,
              "went_back": 0, "resumes": 0, "finished_runs": []}
    chain = 0
    run = work / f"run-{chain}"
    while report["kills"] < kills_wanted:
        latest = checkpoint.latest(run)
        if latest is None:  # nothing complete yet: a user would start over too
            shutil.rmtree(run, ignore_errors=True)
        before = checkpoint.read_meta(latest)["step"] if latest else 0
        report["resumes"] += latest is not None
        pid = spawn(run, latest is not None, work / f"resumed-{chain}.log")
        if report["kills"] % 4 == 3:  # every fourth kill aimed at a checkpoint being written
            _wait_for_a_write(run, pid, deadline=time.monotonic() + duration)
        else:
            time.sleep(rng.uniform(0.0, 0.75 * duration))  # most kills land before the end
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status):  # it finished before the kill
            if os.WEXITSTATUS(status) != 0:
                raise SystemExit(f"child failed in {run}")
            report["finished_runs"].append(str(run))
            chain += 1
            run = work / f"run-{chain}"
            continue
        report["kills"] += 1
        partial = partial_dirs(run)
        report["mid_write"] += any(not name.startswith(".tmp-del-") for name in partial)
        report["mid_prune"] += any(name.startswith(".tmp-del-") for name in partial)
        after = checkpoint.latest(run)
        after_step = checkpoint.read_meta(after)["step"] if after else 0
        report["before_first_checkpoint"] += after is None
        report["went_back"] += after_step < before
    if checkpoint.latest(run) is not None:
        run_to_end(run, work / f"resumed-{chain}.log")
        report["finished_runs"].append(str(run))
    return report


def same_as(reference: Path, run: Path) -> bool:
    ref_w = torch.load(checkpoint.latest(reference) / checkpoint.WEIGHTS)
    run_w = torch.load(checkpoint.latest(run) / checkpoint.WEIGHTS)
    weights = ref_w.keys() == run_w.keys() and all(torch.equal(ref_w[k], run_w[k]) for k in ref_w)
    samples = (reference / "completions.jsonl").read_text() == (run / "completions.jsonl").read_text()
    return weights and samples and tiny_run.metrics_lines(reference) == tiny_run.metrics_lines(run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    reference = args.work / "reference"
    start = time.perf_counter()
    duration = run_to_end(reference, args.work / "reference.log")
    report = kill_trials(args.work, args.kills, args.seed, duration)
    report["identical"] = [same_as(reference, Path(run)) for run in report["finished_runs"]]
    report["reference_seconds"] = round(duration, 3)
    report["total_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
