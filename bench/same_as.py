"""Prove a change changes no result: the same runs under REF's code and this checkout's, compared exactly.

    python bench/same_as.py REF [--cases train vllm torchrun resume async kl] [--quick] [--keep DIR] [--threads N]
        [--new-keys KEY ...]
    make same-as REF=main ARGS="--quick --cases train resume"

REF is checked out into a temporary git worktree (``git worktree add --detach``). Each case runs one
``grpo train`` command twice on this machine, with the same threads (--threads and OMP_NUM_THREADS), each
into its own run directory: the old code is REF's worktree, the new code this checkout's working tree,
uncommitted changes included. The venv's editable install points at one checkout, so PYTHONPATH and the
working directory (``python -m`` puts it first on sys.path) choose the code; ``import grpo`` run the same
way prints which grpo/__init__.py each side gets, and any other stops the tool.

Compared exactly (NaN equals NaN): metrics.jsonl row by row, every key (rewards, loss, KL, ratio, lengths,
accuracies, alarms, lr) but those that measure time: time_* (time_generate, time_reward, time_update,
time_sync, time_step, time_eval, time_generate_zero_var), seconds_* (seconds_tools, seconds_env) and
tokens_per_second; completions.jsonl (--sample-every 1), the same keys ignored; the final model, every
tensor of RUN/model/**/*.safetensors with torch.equal. Not compared: summary.json (wall-clock seconds),
TensorBoard files, config.json. A fixed step count drops the time budget, and 6 steps fix the automatic
eval_every at 1 (at most steps // 4), so no timing decides what a run does.

Cases: ``grpo train --steps 6 --seed 0 --sample-every 1``, plus QUICK with --quick, plus --train-args;
- train: as is;
- vllm: --engine vllm, vLLM from $GRPO_VLLM_PYTHON or a .venv-vllm beside this checkout or the venv
  (skipped, saying so, when none has it);
- torchrun: under the venv's ``torchrun --standalone --nproc-per-node 2``, OMP_NUM_THREADS=1 and
  --threads 1 per process, as tests/test_distributed.py runs it;
- resume: REF runs the 6 steps with --save-every 3; its run directory is copied without the checkpoints
  after step 3, the model and summary.json, and the new code resumes the copy to step 6 (--resume; the
  step-3 checkpoint cuts the .jsonl logs back to it). Compared with REF's straight run: steps 4-6, the
  last evaluation and the model are the new code's;
- async: --async-lag 1 (batch t sampled in a thread with the weights after update t - 2);
- kl: --beta 0.04 --epochs 2 (the reference model's KL term, two passes over each batch).
The checkpoints (not compared; 1.6 GB each for the embedded model) are deleted once a case has run;
the rest of the runs stays under --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
IGNORED = re.compile(r"^(time_|seconds_)|^tokens_per_second$")
RUN = ["--steps", "6", "--seed", "0", "--sample-every", "1", "--no-progress"]
RESUME_AT = 3
CASES = ("train", "vllm", "torchrun", "resume", "async", "kl")
CASE_ARGS = {"vllm": ["--engine", "vllm"], "resume": ["--save-every", str(RESUME_AT)], "async": ["--async-lag", "1"],
             "kl": ["--beta", "0.04", "--epochs", "2"]}
QUICK = ["--preflight", "off", "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "16"]
BIN = Path(sys.executable).parent


class Failed(Exception):
    """A run that did not finish; the message says which and where its log is."""


def side_env(root: Path, threads: int, vllm: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS=str(threads), **({"GRPO_VLLM_PYTHON": vllm} if vllm else {}))
    return env


def imported_grpo(root: Path, env: dict[str, str]) -> Path:
    """The grpo/__init__.py a run from ``root`` with ``env`` imports; it must be ``root``'s own."""
    out = subprocess.run([sys.executable, "-c", "import grpo; print(grpo.__file__)"], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    if Path(out).resolve() != root / "grpo" / "__init__.py":
        sys.exit(f"same_as: with PYTHONPATH={root} grpo comes from {out}, not from {root}")
    return Path(out)


def run(name: str, cmd: list[str], root: Path, env: dict[str, str], log: Path) -> float:
    """Run ``cmd`` from ``root``, its output into ``log``; its seconds. Failed when it fails."""
    start = time.perf_counter()
    with log.open("w") as out:  # a session of its own: stopping the tool stops the run's workers too
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    if code:
        raise Failed(f"the {name} run failed (exit {code}), see {log}")
    return time.perf_counter() - start


def train_cmd(case: str, output: Path, threads: int, extra: list[str]) -> list[str]:
    launch = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2"] if case == "torchrun" else [sys.executable]
    return [*launch, "-m", "grpo", "train", "--output", str(output), "--threads", str(threads),
            *RUN, *CASE_ARGS.get(case, []), *extra]


def copy_to_step(old: Path, new: Path, step: int) -> None:
    """Copy run ``old`` to ``new`` as a run stopped after ``step``: no later checkpoint, no model or summary."""
    def later(folder: str, names: list[str]) -> list[str]:
        if Path(folder) == old / "checkpoints":
            return [name for name in names if name.startswith("step-") and int(name[5:]) > step]
        return [name for name in names if name in ("model", "summary.json")] if Path(folder) == old else []

    shutil.copytree(old, new, ignore=later)


def run_case(case: str, sides: dict[str, Path], folder: Path, args: argparse.Namespace) -> str | None:
    """Run ``case`` under both codes into ``folder``/old and /new; the first difference, or None."""
    threads = 1 if case == "torchrun" else args.threads
    env = {name: side_env(root, threads, args.vllm_python) for name, root in sides.items()}
    old, new = folder / "old", folder / "new"
    seconds = {"old": run("old", train_cmd(case, old, threads, args.extra), sides["old"], env["old"],
                          folder / "old.log")}
    if case == "resume":
        copy_to_step(old, new, RESUME_AT)
        cmd = [sys.executable, "-m", "grpo", "train", "--resume", str(new), "--steps", RUN[1], "--no-progress"]
    else:
        cmd = train_cmd(case, new, threads, args.extra)
    seconds["new"] = run("new", cmd, sides["new"], env["new"], folder / "new.log")
    print(f"{case}: old {seconds['old']:.0f} s, new {seconds['new']:.0f} s", flush=True)
    for run_dir in (old, new):  # not compared, and 1.6 GB each (AdamW's state) for the embedded model
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return compare_runs(old, new, set(args.new_keys))


def compare_runs(old: Path, new: Path, new_keys: set[str] = frozenset()) -> str | None:
    for name in ("metrics.jsonl", "completions.jsonl"):
        if (old / name).exists() or (new / name).exists():
            found = compare_rows(name, read_rows(old / name), read_rows(new / name), new_keys)
            if found:
                return found
    return compare_weights(old / "model", new / "model")


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def same_value(a: object, b: object) -> bool:
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a == b or both_nan


def compare_rows(name: str, old: list[dict], new: list[dict], new_keys: set[str] = frozenset()) -> str | None:
    """The first difference of two runs' rows; a key in ``new_keys`` (a metric the new code adds) is compared
    only where the old rows have it too."""
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        for key in sorted(a.keys() | b.keys()):
            x, y = a.get(key, "(absent)"), b.get(key, "(absent)")
            added = key in new_keys and key not in a
            if not IGNORED.match(key) and not added and not same_value(x, y):
                return f"{name} row {i} (step {a.get('step')}) {key}: old {x!r} vs new {y!r}"
    if len(old) != len(new):
        return f"{name}: old has {len(old)} rows, new {len(new)}"
    return None


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(folder.rglob("*.safetensors")):
        prefix = "" if path.parent == folder else f"{path.parent.relative_to(folder)}/"
        tensors.update({prefix + name: value for name, value in load_file(path).items()})
    return tensors


def compare_weights(old: Path, new: Path) -> str | None:
    a, b = load_tensors(old), load_tensors(new)
    if not a or a.keys() != b.keys():
        names = sorted(a.keys() ^ b.keys())
        return f"model: old has {len(a)} tensors, new {len(b)}" + (f"; e.g. {names[0]} in one only" if names else "")
    for name in sorted(a):
        x, y = a[name], b[name]
        if not torch.equal(x, y):
            gap = f"max |old - new| {(x.double() - y.double()).abs().max().item():.3g}" if x.shape == y.shape \
                else f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
            return f"model tensor {name}: {gap}"
    return None


def vllm_python() -> str:
    """A Python with vLLM: $GRPO_VLLM_PYTHON, else .venv-vllm beside this checkout or the venv; '' if none."""
    candidates = [os.environ.get("GRPO_VLLM_PYTHON", ""), str(ROOT / ".venv-vllm" / "bin" / "python"),
                  str(Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python")]
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run([python, "-c", check], capture_output=True).returncode == 0:
            return python
    return ""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the git revision whose results the working tree must reproduce")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="default: all")
    parser.add_argument("--keep", default="", metavar="DIR",
                        help="keep the runs under this folder (default: a temporary one, removed)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="threads per run, both sides (--threads and OMP_NUM_THREADS; default: all CPUs)")
    parser.add_argument("--train-args", dest="extra", type=shlex.split, default=[], metavar='"OPTIONS"',
                        help='more grpo train options for both sides, e.g. "--lr 1e-4"')
    parser.add_argument("--new-keys", nargs="+", default=[], metavar="KEY",
                        help="metrics the new code adds: not compared where the old rows lack them")
    parser.add_argument("--quick", action="store_true", help=f"also {' '.join(QUICK)}: a 6-step run in minutes on 2 cores")
    args = parser.parse_args()
    args.extra = (QUICK if args.quick else []) + args.extra
    args.vllm_python = vllm_python() if "vllm" in args.cases else ""
    return args


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"same_as: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def run_cases(args: argparse.Namespace, sides: dict[str, Path], keep: Path) -> int:
    """Run and compare each case, one line each; how many were identical."""
    identical = 0
    for case in args.cases:
        (keep / case).mkdir(parents=True)
        try:
            found = run_case(case, sides, keep / case, args)
        except Failed as err:
            found = str(err)
        identical += found is None
        print(f"same: {case}" if found is None else f"DIFFERENT: {case}: {found}", flush=True)
    return identical


def main() -> int:
    args = parse_args()
    if args.keep and (taken := [case for case in args.cases if (Path(args.keep) / case).exists()]):
        sys.exit(f"same_as: {Path(args.keep) / taken[0]} exists; give another --keep")
    if "vllm" in args.cases and not args.vllm_python:
        print("skipped: vllm: no Python with vLLM ($GRPO_VLLM_PYTHON, or .venv-vllm: make vllm)")
        args.cases.remove("vllm")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs stopped, worktree removed, as on Ctrl-C
    tmp = Path(tempfile.mkdtemp(prefix="same-as-"))
    sides = {"old": tmp / "ref", "new": ROOT}
    try:
        git("worktree", "add", "--quiet", "--detach", str(sides["old"]), args.ref)
        print(f"old: {args.ref} ({git('rev-parse', '--short', args.ref)}), "
              f"imports {imported_grpo(sides['old'], side_env(sides['old'], 1, ''))}")
        print(f"new: the working tree, imports {imported_grpo(ROOT, side_env(ROOT, 1, ''))}", flush=True)
        identical = run_cases(args, sides, Path(args.keep).resolve() if args.keep else tmp / "runs")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(sides["old"])], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"same_as {args.ref}: {identical} of {len(args.cases)} cases identical")
    return 0 if identical == len(args.cases) else 1


if __name__ == "__main__":
    sys.exit(main())
