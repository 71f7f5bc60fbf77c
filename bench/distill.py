"""Issue 56's acceptance measurements: on-policy distillation against GRPO. Written, not yet run (each
experiment takes about an hour on a CPU); the figures go to bench/README.md when measured.

    python bench/distill.py pure --seeds 0 1 2              # the teacher: trained first unless --teacher
    python bench/distill.py rewards --data DIR/subtract.jsonl --teacher runs/<run>/model --minutes 10

- ``pure``: the teacher is the model the default `grpo train` writes (trained here for --teacher-steps steps
  unless --teacher names one), its held-out accuracy A. Both arms start from the embedded model on ``add``:
  GRPO, and pure distillation (``--teacher T --rewards none``). After every step the whole held-out set is
  scored (not counted as training time); an arm ends at 0.9 A or after --max-minutes of training. Per seed:
  the training seconds each arm needed, and their ratio (distillation's over GRPO's; the floor is below 1
  on every seed, the goal a third).
- ``rewards``: on a --data file (bench/user_files.py's subtraction file), GRPO alone against GRPO plus the
  teacher's term (--teacher: a model GRPO trained on that file) for --minutes of training each: the held-out
  accuracy at the end, mean, min and max over the seeds, and the difference (the goal: +5 points).

The table goes to stdout and OUT/summary.json; each step's metrics to OUT/<arm>-seed<k>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grpo.config import TrainConfig  # noqa: E402
from grpo.observe.heldout import evaluate_heldout  # noqa: E402
from grpo.run.build import resolve_run  # noqa: E402
from grpo.run.process_setup import setup_process  # noqa: E402
from grpo.run.trainer import GRPOTrainer  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("experiment", choices=("pure", "rewards"))
    p.add_argument("--teacher", default="", help="the teacher's model folder (pure: trained here when empty)")
    p.add_argument("--teacher-steps", type=int, default=20, help="pure: steps of the teacher's GRPO run (default 20)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--data", default="", help="rewards: the --data file (bench/user_files.py's subtract.jsonl)")
    p.add_argument("--minutes", type=float, default=10.0, help="rewards: training minutes per arm (default 10)")
    p.add_argument("--max-minutes", type=float, default=30.0, help="pure: most training minutes per arm")
    p.add_argument("--teacher-coef", type=float, default=1.0)
    p.add_argument("--eval-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="runs/bench-distill")
    return p.parse_args(argv)


def trainer_for(config: TrainConfig) -> GRPOTrainer:
    setup_process(config)
    return GRPOTrainer(resolve_run(config), progress=False)


def train_teacher(args: argparse.Namespace, out: Path) -> str:
    """The default `grpo train` run's model (--teacher-steps steps), written under OUT/teacher."""
    config = TrainConfig(steps=args.teacher_steps, threads=args.threads, output=str(out / "teacher"))
    trainer = trainer_for(config)
    try:
        trainer.train(out / "teacher")
    finally:
        trainer.close()
    return str(out / "teacher" / "model")


def heldout_accuracy(config: TrainConfig) -> float:
    trainer = trainer_for(config)
    try:
        return evaluate_heldout(trainer.sampling).accuracy
    finally:
        trainer.close()


def seconds_to_reach(config: TrainConfig, target: float, max_minutes: float, log: Path) -> dict:
    """Train, scoring the whole held-out set after every step, until ``target`` accuracy or the cap; the
    training seconds spent (evaluation not counted) and the accuracies seen."""
    trainer, seconds, seen = trainer_for(config), 0.0, []
    try:
        with log.open("w") as out:
            while seconds < 60 * max_minutes:
                began = time.perf_counter()
                metrics = trainer.step(len(seen) + 1)
                seconds += time.perf_counter() - began
                seen.append(evaluate_heldout(trainer.sampling).accuracy)
                out.write(json.dumps({"step": len(seen), "train_seconds": seconds, "accuracy": seen[-1],
                                      **metrics}) + "\n")
                if seen[-1] >= target:
                    return {"seconds": seconds, "reached": True, "accuracies": seen}
    finally:
        trainer.close()
    return {"seconds": seconds, "reached": False, "accuracies": seen}


def pure(args: argparse.Namespace, out: Path) -> dict:
    teacher = args.teacher or train_teacher(args, out)
    a = heldout_accuracy(TrainConfig(model=teacher, eval_size=args.eval_size, threads=args.threads))
    arms = {"grpo": {}, "distill": {"teacher": teacher, "rewards": ("none",), "teacher_coef": args.teacher_coef}}
    rows = []
    for seed in args.seeds:
        row = {"seed": seed}
        for arm, extra in arms.items():
            config = TrainConfig(seed=seed, steps=1_000_000, eval_size=args.eval_size, threads=args.threads,
                                 save_model=False, sample_every=0, log_every=0, early_stop=False, **extra)
            row[arm] = seconds_to_reach(config, 0.9 * a, args.max_minutes, out / f"{arm}-seed{seed}.jsonl")
        row["ratio"] = row["distill"]["seconds"] / max(row["grpo"]["seconds"], 1e-9)
        rows.append(row)
        print(f"seed {seed}: GRPO {row['grpo']['seconds']:.0f} s, distillation {row['distill']['seconds']:.0f} s "
              f"to 0.9 A = {0.9 * a:.3f} (ratio {row['ratio']:.2f})", flush=True)
    return {"teacher": teacher, "teacher_accuracy": a, "target": 0.9 * a, "seeds": rows,
            "floor_met": all(r["distill"]["reached"] and r["ratio"] < 1 for r in rows)}


def rewards(args: argparse.Namespace, out: Path) -> dict:
    if not (args.data and args.teacher):
        raise SystemExit("rewards: give --data FILE and --teacher (a model GRPO trained on that file)")
    ends: dict[str, list[float]] = {"grpo": [], "grpo+teacher": []}
    for seed in args.seeds:
        for arm in ends:
            extra = {"teacher": args.teacher, "teacher_coef": args.teacher_coef} if arm != "grpo" else {}
            config = TrainConfig(data=args.data, seed=seed, minutes=args.minutes, steps=1_000_000,
                                 eval_size=args.eval_size, threads=args.threads, save_model=False,
                                 early_stop=False, output=str(out / f"{arm}-seed{seed}"), **extra)
            trainer = trainer_for(config)
            try:
                ends[arm].append(trainer.train(out / f"{arm}-seed{seed}")["heldout_accuracy_end"])
            finally:
                trainer.close()
    spread = {arm: {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "each": v} for arm, v in ends.items()}
    spread["difference_points"] = 100 * (spread["grpo+teacher"]["mean"] - spread["grpo"]["mean"])
    return spread


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = pure(args, out) if args.experiment == "pure" else rewards(args, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
