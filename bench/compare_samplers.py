"""Uniform prompts vs the frontier sampler with dynamic sampling, for the same wall-clock budget.

    python bench/compare_samplers.py --minutes 10 --seeds 0 1 2

For each configuration (``uniform``; ``frontier`` + ``--filter-groups``; the same
with ``--screen 4``, grpo/sampling/screen.py; uniform draws with filter_groups, with and
without the screen, for a ``--set data=FILE`` run) and seed it evaluates the model on the held-out prompts, trains for ``--minutes``
of wall-clock time (evaluation not counted), evaluates again, and reports:

- the fraction of trained groups with zero reward variance, and of generated ones
  (with filter_groups the trained batch holds only informative groups, so the
  generated fraction is where the sampler's quality shows);
- held-out greedy accuracy at the end, mean and spread over seeds;
- steps and completions (generated) per minute;
- the share of generation time spent on zero-variance groups, and with the
  screening prefill of the candidates it skipped counted as wasted too.

Then it measures what skipping the forward/backward of zero-advantage groups
saves: ``--skip-check-steps`` uniform steps with the skip on and off, from the
same seed, and their mean update times.

Per-step metrics go to OUT/<config>-seed<k>.jsonl, the table to stdout and
OUT/summary.json; the last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import re
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo.config import TrainConfig  # noqa: E402
from grpo.observe.heldout import evaluate_heldout  # noqa: E402
from grpo.run.build import resolve_run  # noqa: E402
from grpo.run.process_setup import setup_process  # noqa: E402
from grpo.run.trainer import GRPOTrainer  # noqa: E402

CONFIGS = {
    "uniform": {"sampler": "uniform", "filter_groups": False},
    "frontier+filter": {"sampler": "frontier", "filter_groups": True},
    # screening (grpo/sampling/screen.py): 4 candidates prefilled per group generated, the likeliest to vary kept
    "frontier+filter+screen": {"sampler": "frontier", "filter_groups": True, "screen": 4},
    # a --data file's default (uniform draws) with and without screening: --set data=FILE
    "uniform+filter": {"sampler": "uniform", "filter_groups": True},
    "uniform+filter+screen": {"sampler": "uniform", "filter_groups": True, "screen": 4},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training wall-clock budget per run (default: 10)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per configuration (default: 0 1 2)")
    p.add_argument("--configs", nargs="+", default=["uniform", "frontier+filter", "frontier+filter+screen"],
                   choices=list(CONFIGS), help="configurations to run (default: uniform, frontier+filter, frontier+filter+screen)")
    p.add_argument("--model", default="smollm2", help="model (default: the embedded smollm2)")
    p.add_argument("--task", default="arith-mix", help="built-in task (default: arith-mix)")
    p.add_argument("--eval-size", type=int, default=256, help="held-out prompts (default: 256)")
    p.add_argument("--prompts-per-step", type=int, default=16, help="B (default: 16)")
    p.add_argument("--group-size", type=int, default=8, help="G (default: 8)")
    p.add_argument("--max-new-tokens", type=int, default=10, help="tokens per completion (default: 10)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own process; with 2, each seed's two configurations run side by "
                        "side and share the machine alike (pair it with --set threads=1 on 2 cores; default: 1)")
    p.add_argument("--skip-check-steps", type=int, default=10,
                   help="uniform steps timed with and without skipping zero-advantage groups (0: no check; default: 10)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="further TrainConfig fields for every run, e.g. lr=1e-5 explore_frac=0.2")
    p.add_argument("--out", default="runs/compare-samplers", help="folder for the per-step metrics and summary.json")
    return p.parse_args(argv)


def base_config(args: argparse.Namespace) -> TrainConfig:
    extra = {}
    for item in args.set:
        key, _, text = item.partition("=")
        try:
            extra[key] = json.loads(text)
        except ValueError:
            extra[key] = text
    return TrainConfig.from_dict({
        "model": args.model, "task": args.task, "eval_size": args.eval_size,
        "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "device": args.device, "steps": 1_000_000,
        "save_model": False, "sample_every": 0, "log_every": 0, **extra,
    })


OPERATION = re.compile(r"(\d+)\s*([+-])\s*(\d+)")


def carry_bucket(prompt: str) -> str | None:
    """"carry" or "no carry" for a prompt of two numbers added ("borrow" / "no borrow" subtracted), by its
    units digits; None for any other prompt."""
    found = OPERATION.search(prompt)
    if found is None:
        return None
    a, op, b = int(found.group(1)), found.group(2), int(found.group(3))
    if op == "+":
        return "carry" if a % 10 + b % 10 >= 10 else "no carry"
    return "borrow" if a % 10 < b % 10 else "no borrow"


def bucket_accuracy(rows: list[dict], start: tuple[bool, ...], end: tuple[bool, ...]) -> dict[str, dict]:
    """Held-out greedy accuracy at the end per difficulty bucket: the prompts the starting model solved
    and those it did not (any task), and carry or not (a task of two numbers added or subtracted).
    Each bucket: its size and the accuracy at the start and at the end."""
    buckets: dict[str, list[int]] = {"solved at start": [], "unsolved at start": []}
    for i, row in enumerate(rows[: len(end)]):
        buckets["solved at start" if start[i] else "unsolved at start"].append(i)
        kind = carry_bucket(str(row.get("prompt", "")))
        if kind is not None:
            buckets.setdefault(kind, []).append(i)
    return {name: {"size": len(ix), "start": sum(start[i] for i in ix) / len(ix),
                   "end": sum(end[i] for i in ix) / len(ix)} for name, ix in buckets.items() if ix}


def timed_run(config: TrainConfig, minutes: float, log_path: Path) -> dict:
    """Evaluate, train until the budget is spent (finishing the step under way), evaluate; return the figures."""
    setup_process(config)
    trainer = GRPOTrainer(resolve_run(config), progress=False)
    start = evaluate_heldout(trainer.sampling)
    steps: list[dict] = []
    began = time.perf_counter()
    with log_path.open("w") as log:
        while time.perf_counter() - began < minutes * 60:
            metrics = trainer.step(len(steps) + 1)
            steps.append(metrics)
            log.write(json.dumps({"step": len(steps), **metrics}) + "\n")
    train_minutes = (time.perf_counter() - began) / 60
    end = evaluate_heldout(trainer.sampling)
    buckets = bucket_accuracy(list(trainer.sampling.task.heldout), start.solved, end.solved)
    trainer.close()  # its reward workers: left open, the pool's process waits on them at exit and the run hangs
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trained = sum(m["trained_groups"] for m in steps)
    generated = sum(m["generated_groups"] for m in steps)
    return {
        "seed": config.seed,
        "heldout_accuracy_start": start.accuracy,
        "heldout_accuracy_end": end.accuracy,
        "buckets": buckets,
        "steps": len(steps),
        "train_minutes": round(train_minutes, 3),
        "steps_per_minute": len(steps) / train_minutes,
        "completions_per_minute": generated * config.group_size / train_minutes,
        "trained_completions_per_minute": trained * config.group_size / train_minutes,
        "trained_zero_var_frac": sum(m["trained_zero_var_frac"] * m["trained_groups"] for m in steps) / max(trained, 1),
        "generated_zero_var_frac": sum(m["zero_var_frac"] * m["generated_groups"] for m in steps) / max(generated, 1),
        "generate_time_zero_var_share": (sum(m["time_generate_zero_var"] for m in steps)
                                         / max(sum(m["time_generate"] for m in steps), 1e-9)),
        # screening's prefill counts as generation, and as wasted for the candidates it skipped
        "generate_time_wasted_share": (sum(m["time_generate_zero_var"] + m["time_screen_skipped"] for m in steps)
                                       / max(sum(m["time_generate"] + m["time_screen"] for m in steps), 1e-9)),
        "gen_rounds_mean": statistics.fmean(m["gen_rounds"] for m in steps) if steps else 0.0,
        "shortfall_mean": statistics.fmean(m["shortfall"] for m in steps) if steps else 0.0,
    }


def skip_check(config: TrainConfig, steps: int) -> dict:
    """Mean update seconds of the same uniform steps with and without skipping zero-advantage groups."""
    out = {}
    for skip in (True, False):
        uniform = replace(config, sampler="uniform", filter_groups=False, skip_zero_advantage=skip)
        setup_process(uniform)
        trainer = GRPOTrainer(resolve_run(uniform), progress=False)
        runs = [trainer.step(s) for s in range(1, steps + 1)]
        trainer.close()
        out["skip" if skip else "no_skip"] = {
            "time_update_mean": statistics.fmean(m["time_update"] for m in runs),
            "skipped_tokens_frac": statistics.fmean(m["update_skipped_tokens_frac"] for m in runs),
            "zero_var_frac": statistics.fmean(m["zero_var_frac"] for m in runs),
        }
        del trainer
        gc.collect()
    out["update_time_saved_frac"] = 1.0 - out["skip"]["time_update_mean"] / out["no_skip"]["time_update_mean"]
    return out


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarise(runs: list[dict]) -> dict:
    keys = ("heldout_accuracy_start", "heldout_accuracy_end", "trained_zero_var_frac", "generated_zero_var_frac",
            "steps_per_minute", "completions_per_minute", "trained_completions_per_minute",
            "generate_time_zero_var_share", "generate_time_wasted_share", "gen_rounds_mean", "shortfall_mean")
    return {k: spread([r[k] for r in runs]) for k in keys}


def table(summary: dict) -> str:
    rows = [("held-out accuracy, start", "heldout_accuracy_start", "{:.1%}"),
            ("held-out accuracy, end", "heldout_accuracy_end", "{:.1%}"),
            ("zero-variance groups, trained", "trained_zero_var_frac", "{:.1%}"),
            ("zero-variance groups, generated", "generated_zero_var_frac", "{:.1%}"),
            ("generation time on zero-var groups", "generate_time_zero_var_share", "{:.1%}"),
            ("... and on screening skipped prompts", "generate_time_wasted_share", "{:.1%}"),
            ("steps / min", "steps_per_minute", "{:.2f}"),
            ("completions / min (generated)", "completions_per_minute", "{:.0f}"),
            ("completions / min (trained)", "trained_completions_per_minute", "{:.0f}"),
            ("generation rounds per step", "gen_rounds_mean", "{:.2f}")]
    names = list(summary)
    lines = [f"{'':38}" + "".join(f"{n:>30}" for n in names)]
    for label, key, fmt in rows:
        cells = []
        for n in names:
            s = summary[n][key]
            cells.append(f"{fmt.format(s['mean'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]")
        lines.append(f"{label:38}" + "".join(f"{c:>30}" for c in cells))
    return "\n".join(lines)


def bucket_table(runs: dict[str, list[dict]]) -> str:
    """Held-out accuracy at the end per difficulty bucket, mean [min, max] over seeds, per configuration."""
    names = list(runs)
    kinds = list(dict.fromkeys(k for r in runs.values() for run in r for k in run["buckets"]))
    lines = [f"{'held-out accuracy at the end, by bucket':38}" + "".join(f"{n:>30}" for n in names)]
    for kind in kinds:
        cells = []
        for n in names:
            ends = [run["buckets"][kind]["end"] for run in runs[n] if kind in run["buckets"]]
            cells.append(f"{statistics.fmean(ends):.1%} [{min(ends):.1%}, {max(ends):.1%}]" if ends else "-")
        sizes = sorted({run["buckets"][kind]["size"] for r in runs.values() for run in r if kind in run["buckets"]})
        lines.append(f"{kind + ' (' + '/'.join(map(str, sizes)) + ' prompts)':38}" + "".join(f"{c:>30}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = base_config(args)
    runs: dict[str, list[dict]] = {}
    # seed-major order, so that with --jobs 2 the configurations of one seed run side by side
    plan = [(name, seed) for seed in args.seeds for name in args.configs]
    context = multiprocessing.get_context("spawn")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that a kill also stops the runs under way
    try:
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context, max_tasks_per_child=1) as pool:
            futures = [(name, seed, pool.submit(timed_run, replace(base, seed=seed, **CONFIGS[name]), args.minutes,
                                                out / f"{name}-seed{seed}.jsonl"))
                       for name, seed in plan]
            for name, seed, future in futures:
                result = future.result()
                runs.setdefault(name, []).append(result)
                print(f"{name} seed {seed}: {json.dumps(result)}", flush=True)
    except BaseException:
        for child in multiprocessing.active_children():  # left alone they would run on, stealing the CPU
            child.terminate()
        raise
    runs = {name: runs[name] for name in args.configs}
    summary = {name: summarise(r) for name, r in runs.items()}
    print(f"\n{args.task}, {args.minutes:g} min of training per run, seeds {args.seeds}, {args.jobs} run(s) at "
          f"once, {base.threads or torch.get_num_threads()} thread(s) each; mean [min, max] over seeds")
    print(table(summary))
    print(bucket_table(runs))
    report = {"task": args.task, "minutes": args.minutes, "seeds": args.seeds, "jobs": args.jobs,
              "config": base.to_dict(),
              "summary": summary, "runs": runs}
    if args.skip_check_steps:
        report["skip_check"] = skip_check(replace(base, seed=args.seeds[0]), args.skip_check_steps)
        sc = report["skip_check"]
        print(f"skipping zero-advantage groups: update {sc['no_skip']['time_update_mean']:.3f}s -> "
              f"{sc['skip']['time_update_mean']:.3f}s per step ({sc['update_time_saved_frac']:.0%} saved; "
              f"{sc['skip']['skipped_tokens_frac']:.0%} of the batch's tokens skipped)")
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    compact = {name: {k: round(v["mean"], 4) for k, v in s.items()} for name, s in summary.items()}
    compact_acc = {name: round(s["heldout_accuracy_end"]["std"], 4) for name, s in summary.items()}
    print(json.dumps({"task": args.task, "minutes": args.minutes, "seeds": args.seeds, "means": compact,
                      "heldout_accuracy_end_std": compact_acc,
                      "update_time_saved_frac": report.get("skip_check", {}).get("update_time_saved_frac")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
