"""bench/gpu_check.py on the CPU with a tiny model: every phase runs and prints its line.

It runs as on a GPU machine that has torch and transformers alone: the
packages the trainer's path must not need are made unimportable first.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
ABSENT = ("rich", "math_verify", "gguf", "vllm", "peft", "datasets", "matplotlib", "tensorboard", "pyarrow", "wandb")


def test_gpu_check_runs_every_phase_on_the_cpu_without_the_optional_packages():
    # --torchrun: the 2-process step too (gloo on the CPU), as it runs on a machine with 2 GPUs
    code = (f"import runpy, sys; sys.modules.update(dict.fromkeys({ABSENT!r}));"
            f"sys.argv = [{str(SCRIPT)!r}, '--device', 'cpu', '--tiny', '--torchrun'];"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # the script finds grpo in its checkout itself
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    for phase in ("build tiny", "preflight tiny", "train tiny", "train-ckpt tiny", "checkpoint tiny", "torchrun tiny"):
        assert phase in lines and " s " in lines[phase] and "tok/s" in lines[phase] and "peak RSS" in lines[phase], out
    assert "logp gap mean" in lines["train tiny"] and "MFU    n/a" in lines["train tiny"], out
    assert "logp gap mean" in lines["train-ckpt tiny"], out  # --gradient-checkpointing trained its 3 steps
    for phase in ("preflight tiny", "train tiny", "train-ckpt tiny"):  # grpo/memory.py's prediction beside it
        assert "(predicted " in lines[phase] and "measured/predicted " in lines[phase], lines[phase]
    assert out.splitlines()[-1].startswith("gpu_check: every phase passed")
    assert f"grpo from {ROOT / 'grpo'}" in out
