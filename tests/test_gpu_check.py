"""bench/gpu_check.py on the CPU with a tiny model: every phase runs and prints its line.

It runs as on a GPU machine that has torch and transformers alone: the
packages the trainer's path must not need are made unimportable first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
ABSENT = ("rich", "math_verify", "gguf", "vllm", "peft", "datasets", "matplotlib", "tensorboard", "pyarrow", "wandb")


def test_gpu_check_runs_every_phase_on_the_cpu_without_the_optional_packages():
    # --torchrun: the 2-process step too (gloo on the CPU), as it runs on a machine with 2 GPUs
    code = (f"import runpy, sys; sys.modules.update(dict.fromkeys({ABSENT!r}));"
            f"sys.argv = [{str(SCRIPT)!r}, '--device', 'cpu', '--tiny', '--torchrun', '--no-paths'];"
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
    # every phase that samples counts its tokens (the count itself is checked against the loop's below)
    for phase in ("preflight tiny", "train tiny", "train-ckpt tiny", "checkpoint tiny"):
        tokens = int(lines[phase].split(" tok ")[0].split()[-1])
        rate = float(lines[phase].split(" tok/s")[0].split()[-1])
        assert tokens > 0 and rate > 0, lines[phase]
    assert "logp gap mean" in lines["train-ckpt tiny"], out  # --gradient-checkpointing trained its 3 steps
    for phase in ("preflight tiny", "train tiny", "train-ckpt tiny"):  # grpo/run/memory.py's prediction beside it
        assert "(predicted " in lines[phase] and "measured/predicted " in lines[phase], lines[phase]
    assert out.splitlines()[-1].startswith("gpu_check: every phase passed")
    assert f"grpo from {ROOT / 'grpo'}" in out


def test_tokens_counted_from_the_steps_metrics_are_the_tokens_the_loop_sampled(tmp_path, monkeypatch):
    """Counts.add_step on metrics.jsonl's lines gives the completions' lengths that each generation round
    of the loop really produced (read where the loop samples: grpo.sampling.rounds.sample_and_score)."""
    from tiny_run import tiny_trainer

    import grpo.sampling.rounds

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # its dataclasses look their module up there
    spec.loader.exec_module(gpu_check)
    produced, real = [], grpo.sampling.rounds.sample_and_score

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        produced.append(int(out[0].lengths.sum()))
        return out

    monkeypatch.setattr(grpo.sampling.rounds, "sample_and_score", counted)
    trainer = tiny_trainer(steps=2, save_every=100, filter_groups=True, max_gen_rounds=2)
    trainer.train(tmp_path / "run")
    counts = gpu_check.Counts()
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        if "optimizer_steps" in metrics:
            counts.add_step(metrics, trainer.config.group_size)
    assert counts.sampled == sum(produced) > 0


@pytest.mark.slow
def test_gpu_check_runs_the_user_paths_each_in_a_fresh_process_on_the_cpu():
    # the CLI (memory check, init_world, r1-zero, --beta, save_model), resume, grpo eval, LoRA, a __main__
    # reward and FSDP in a world of one; vLLM left out (its CPU build starts in minutes)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--paths-only", "--no-vllm"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    for phase in ("cli r1-zero tiny", "resume tiny", "cli lora tiny", "main-reward tiny", "fsdp tiny"):
        assert " tok/s" in lines[phase] and "measured/predicted " in lines[phase], out  # its child's peak
    assert "peak RSS    n/a" in lines["eval tiny"], out  # a child's peak not read: not this process's
    assert "skipped: --no-vllm" in lines["cli vllm tiny"]
    assert out.splitlines()[-1].startswith("gpu_check: every phase passed")


def test_a_failed_path_is_named_and_the_check_goes_on(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check_failing", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check_failing"] = gpu_check
    try:
        spec.loader.exec_module(gpu_check)
        check = gpu_check.Check(gpu_check.torch.device("cpu"), None)
        gpu_check.run_command(check, "cli broken", [sys.executable, "-c", "import sys; sys.exit('no room')"])
        gpu_check.run_command(check, "cli fine", [sys.executable, "-c", "pass"])
    finally:
        del sys.modules["gpu_check_failing"]
    out = capsys.readouterr().out
    assert check.failed == ["cli broken"]
    assert "cli broken         FAILED: RuntimeError: exited with 1: no room" in out and "cli fine " in out
