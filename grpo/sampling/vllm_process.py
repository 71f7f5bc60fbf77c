"""vLLM's process, from the trainer's side: the worker script it runs, the environment it does not inherit, its
start's time limit, the cores it may use, its failures in one line, and its end."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

WORKER = Path(__file__).parents[1] / "vllm_side" / "grpo_vllm_worker.py"
# vLLM's whole start (our model write, its load, memory profiling, compilation, warm-up) may take this long at
# most: under torchrun every rank starts its engine at its first rollout, and a rank with no group in that
# draw (or a faster start) waits for the others in the step's first collective, which NCCL ends after 600 s
# by default (torch's default_pg_nccl_timeout). Below that, a slow start fails here, with a message that
# names vLLM's log, rather than as a collective timeout; gloo (the CPU) waits 30 minutes by default.
# Raising the process group's timeout instead would delay every real hang's report as much.
START_SECONDS = {"cuda": 480, "cpu": 900}
TORCHRUN_VARS = frozenset(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                           "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"))


def _root_cause(log: Path) -> str:
    """The last error line in the worker's log that is not vLLM's own "see the root cause above"."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line) and "root cause above" not in line]
    return errors[-1] if errors else ""


def cpu_share(local_rank: int, local_size: int, cores: int) -> str:
    """The cores of one of ``local_size`` processes on a machine, as vLLM's thread binding writes them
    ("0-3"): whole equal shares, so engines sampling at the same time do not fight over cores."""
    per = max(1, cores // local_size)
    first = (local_rank * per) % cores
    return str(first) if per == 1 else f"{first}-{first + per - 1}"


def _explain(kind: str, text: str, starting: bool, memory: float, log: Path) -> str:
    """One line: what failed and what to do about it."""
    first = " ".join(text.split())[:400]
    if kind == "memory":
        return (f"--engine vllm: not enough memory for vLLM ({first}); lower --vllm-memory (now {memory:g}) "
                f"if the machine is short of memory, raise it if vLLM found too little room for its KV cache "
                f"(log: {log})")
    if kind == "killed":  # SIGKILL comes from outside: a user, or the kernel when memory runs out
        return (f"--engine vllm: {first} (if not by hand, the out-of-memory killer: check `dmesg`, and lower "
                f"--vllm-memory, now {memory:g}, if the machine is short of memory) (log: {log})")
    what = "could not start" if starting else "failed"
    hint = "; check the engine's options" if kind == "option" else ""
    return f"--engine vllm: vLLM {what}: {first}{hint} (log: {log})"


def _shutdown(folder: Path, procs: list) -> None:
    """End the worker (when there is one) and remove its files; safe to call twice."""
    proc = procs[0]
    if proc is not None:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)  # the worker and the engine processes vLLM started
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
    shutil.rmtree(folder, ignore_errors=True)
