"""The GPU path in one command: does a first CUDA run work, how fast, in how much memory?

    python bench/gpu_check.py                        # a CUDA machine: Qwen2.5-0.5B and -1.5B shapes
    python bench/gpu_check.py --device cpu --tiny    # anywhere, in seconds (tests/test_gpu_check.py)

It needs torch and transformers alone (no internet, vLLM, math-verify, rich or
gguf): the models are random weights in the shapes of Qwen2.5-0.5B and
Qwen2.5-1.5B (``--tiny``: a two-layer model of the same family), and the
tokenizer is SmolLM2's, kept in bench/tokenizer (1.6 MB, with its chat
template). Through grpo's Python API (``GRPOTrainer`` given the model and
tokenizer objects, task ``add``) it runs, per model shape:

- ``build``: the model made on the device and the trainer around it;
- ``preflight``: the pre-flight check (grpo/run/preflight.py);
- ``train``: 3 steps of the default recipe (TrainConfig's defaults) on the own engine;
- ``train-ckpt``: the same with ``gradient_checkpointing`` (each decoder layer run
  again in backward), in a fresh trainer: its peak memory against ``train``'s;

and on the smallest shape ``checkpoint``: 2 steps into a run folder, then a new
trainer resumes it for step 3; with two GPUs (or ``--torchrun``) ``torchrun``:
one step by two processes. Random weights cannot add, so the reward is the
parity of a completion's first character, which splits most groups: every step
trains.

One line per phase: seconds; tokens sampled and per second (from each step's
metrics, every process's; the pre-flight check's from its report); peak memory, beside
grpo/run/memory.py's prediction for the phase (preflight, train, train-ckpt) and their ratio
(``torch.cuda.max_memory_allocated``; on the CPU the process's peak resident
set); MFU, (2 P per sampled token + 6 P per trained completion token) / seconds
/ the GPU's dense bf16 peak (P: the parameters of the matrix products,
attention left out; n/a on the CPU or an unknown GPU without
``--peak-tflops``); and the sampler/trainer log-prob gap |log pi_trainer - log
pi_sampler| per token, the step metrics ``sampler_logp_diff`` (mean) and
``sampler_logp_diff_max``. The exit status is 1 when any phase failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # grpo from this checkout, installed or not
TOKENIZER = HERE / "tokenizer"
STEPS = 3
# the Qwen2.5 models' shapes (their config.json); both tie the output layer to the embeddings
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=49152),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936),
}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}  # dense bf16, by device name


def first_char_parity(completion: str, example: dict) -> float:
    """1 for an odd first character, 0 for an even one: random completions split most groups."""
    return float(ord(completion[0]) % 2) if completion else 0.5


@dataclass
class Counts:
    """What a phase did: tokens sampled, completion tokens trained, and each step's log-prob gap."""

    params: int = 0  # the model's, for MFU (0: no MFU)
    sampled: int = 0
    trained: float = 0.0
    gaps: list[tuple[float, float | None]] = field(default_factory=list)  # (mean, max) per step
    predicted: int | None = None  # grpo/run/memory.py's peak for the phase, bytes (None: not predicted)
    measured: int | None = None  # a child process's measured peak (its preflight.json)
    child: bool = False  # the phase ran in a child process: this process's peak says nothing of it

    def add_step(self, metrics: dict, group_size: int) -> None:
        """A step's metrics (as trainer.step returns them, or as metrics.jsonl holds them).

        Tokens sampled: completion_len, the mean over every completion the step generated (each
        generation round's, every process's), times their number, generated_groups x G.
        """
        self.sampled += round(metrics["completion_len"] * metrics["generated_groups"] * group_size)
        self.trained += metrics["trained_sequences"] * metrics["completion_len"]
        if metrics.get("sampler_logp_diff") is not None:
            self.gaps.append((metrics["sampler_logp_diff"], metrics.get("sampler_logp_diff_max")))


@dataclass
class Check:
    """The run's settings and what its phases found."""

    device: torch.device
    peak_flops: float | None  # per second
    failed: list[str] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)  # the running phase's

    @contextmanager
    def phase(self, name: str, params: int = 0) -> Iterator[Counts]:
        """Measure the body as one phase and print its line; a failure is printed and counted, not raised."""
        self.counts = Counts(params=params)
        _reset_peak_memory(self.device)
        start = time.perf_counter()
        try:
            yield self.counts
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except Exception as err:  # every phase runs, whatever an earlier one did
            traceback.print_exc()
            print(f"{name:<18} FAILED: {type(err).__name__}: {' '.join(str(err).split())[:300]}", flush=True)
            self.failed.append(name)
            return
        print(self.line(name, time.perf_counter() - start), flush=True)

    def line(self, name: str, seconds: float) -> str:
        c = self.counts
        mfu = "n/a"
        if self.peak_flops and c.params:
            mfu = f"{c.params * (2 * c.sampled + 6 * c.trained) / seconds / self.peak_flops:.1%}"
        gap = "-"
        if c.gaps:
            mean, tops = sum(m for m, _ in c.gaps) / len(c.gaps), [t for _, t in c.gaps if t is not None]
            gap = f"mean {mean:.2e} max {max(tops):.2e}" if tops else f"mean {mean:.2e} max n/a"
        memory = "GPU" if self.device.type == "cuda" else "RSS"
        peak = c.measured or (0 if c.child else _peak_memory(self.device))
        said = f" (predicted {c.predicted / 2**30:.2f} GiB, measured/predicted {peak / c.predicted:.2f})" \
            if c.predicted and peak else ""
        shown = f"{peak / 2**30:6.2f} GiB" if peak else "   n/a"
        return (f"{name:<18} {seconds:7.1f} s  {c.sampled:7d} tok {c.sampled / seconds:8.0f} tok/s  peak {memory} "
                f"{shown}{said}  MFU {mfu:>6}  logp gap {gap}")


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the process's peak resident set (VmHWM)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_memory(device: torch.device) -> int:
    """Bytes: the CUDA allocator's peak, or the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build_model(shape: str, device: torch.device, tokenizer: object) -> torch.nn.Module:
    """A random-weight Qwen2 of the shape's sizes, made on the device itself (fast on a GPU), in fp32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).float()


def matmul_params(model: torch.nn.Module) -> int:
    """The parameters of the matrix products one token costs: all, but an untied embedding table."""
    total = sum(p.numel() for p in model.parameters())
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    return total if head is embed else total - embed.numel()


def make_trainer(model: torch.nn.Module, tokenizer: object, device: torch.device, **config: object) -> object:
    """The default recipe on task add, its reward the parity one (named by file, as a user names theirs)."""
    from grpo import GRPOTrainer, TrainConfig
    from grpo.run.build import resolve_run

    settings = dict(task="add", steps=STEPS, device=str(device), eval_size=8, eval_every=-1, save_model=False)
    run = resolve_run(TrainConfig(**{**settings, **config}), rewards=[f"{Path(__file__).resolve()}:first_char_parity"],
                      model=model)
    return GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False)


def free_memory() -> None:
    """Give the memory of the models and trainers dropped so far back before the next one."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_steps(trainer: object, counts: Counts, steps: int = STEPS) -> None:
    """``steps`` GRPO steps; at least one must update the policy."""
    updates = 0
    for step in range(1, steps + 1):
        metrics = trainer.step(step)
        counts.add_step(metrics, trainer.config.group_size)
        updates += metrics["optimizer_steps"]
    if not updates:
        raise RuntimeError(f"none of the {steps} steps updated the policy")


def predicted_phases(trainer: object) -> dict[str, int]:
    """grpo/run/memory.py's prediction for this trainer, per phase (bytes; {} from a grpo without it). On the
    CPU a phase's measured peak resident set holds the process's baseline too, as the prediction does."""
    try:
        from grpo.run.memory_check import trainer_prediction
    except ImportError:
        return {}
    prediction = trainer_prediction(trainer.sampling)[0]
    return prediction.phases if prediction is not None else {}


def check_shape(check: Check, shape: str, tokenizer: object) -> None:
    """build, preflight and train for one model shape, then the gradient-checkpointing hook."""
    from grpo.run.preflight import run_preflight

    trainer = None
    with check.phase(f"build {shape}"):
        trainer = make_trainer(build_model(shape, check.device, tokenizer), tokenizer, check.device)
    if trainer is None:
        return
    params = matmul_params(trainer.model)
    phases = predicted_phases(trainer)
    try:
        with check.phase(f"preflight {shape}", params) as counts:
            counts.predicted = phases.get("the pre-flight round")
            report = run_preflight(trainer.sampling, trainer.learner, fit=False)
            counts.sampled += sum(report.sample_lengths)
            fatal = report.stops("on")
            if fatal:
                raise RuntimeError(fatal[0].message)
        with check.phase(f"train {shape}", params) as counts:
            counts.predicted = max(phases.get("sampling", 0), phases["the update"])
            train_steps(trainer, counts)
    finally:
        trainer.close()
    del trainer
    free_memory()
    train_with_gradient_checkpointing(check, shape, tokenizer, params)


def train_with_gradient_checkpointing(check: Check, shape: str, tokenizer: object, params: int) -> None:
    """The train phase again with gradient checkpointing (skipped, saying so, by a grpo without the option)."""
    from grpo import TrainConfig

    name = f"train-ckpt {shape}"
    if "gradient_checkpointing" not in {f.name for f in dataclasses.fields(TrainConfig)}:
        print(f"{name:<18} skipped: TrainConfig has no gradient_checkpointing yet", flush=True)
        return
    with check.phase(name, params) as counts:
        trainer = make_trainer(build_model(shape, check.device, tokenizer), tokenizer, check.device,
                               gradient_checkpointing=True)
        phases = predicted_phases(trainer)
        counts.predicted = max(phases.get("sampling", 0), phases.get("the update", 0)) or None
        try:
            train_steps(trainer, counts)
        finally:
            trainer.close()
    free_memory()


def checkpoint_and_resume(check: Check, shape: str, tokenizer: object) -> None:
    """2 steps into a run folder (checkpoint at step 2), then a new trainer resumes it for step 3."""
    run_dir = Path(tempfile.mkdtemp(prefix="grpo-gpu-check-"))
    settings = dict(preflight="off", keep_checkpoints=1, save_every=STEPS)
    try:
        with check.phase(f"checkpoint {shape}") as counts:
            for steps, resume in ((STEPS - 1, False), (STEPS, True)):
                model = build_model(shape, check.device, tokenizer)
                counts.params = matmul_params(model)
                trainer = make_trainer(model, tokenizer, check.device, steps=steps, **settings)
                try:
                    summary = trainer.train(run_dir, resume=resume)
                finally:
                    trainer.close()
                del trainer, model
                free_memory()
            logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            trained = [m for m in logged if "optimizer_steps" in m]
            if summary["steps"] != STEPS or [m["step"] for m in trained] != list(range(1, STEPS + 1)):
                raise RuntimeError(f"the resumed run logged steps {[m['step'] for m in trained]}")
            for metrics in trained:
                counts.add_step(metrics, summary_group_size(run_dir))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def summary_group_size(run_dir: Path) -> int:
    """G of the run in run_dir, from its config.json."""
    return json.loads((run_dir / "config.json").read_text())["group_size"]


def torchrun_step(check: Check, shape: str) -> None:
    """One step by two processes under torchrun (NCCL on two GPUs, gloo on the CPU); each prints its line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    with check.phase(f"torchrun {shape}"):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                               __file__, "--rank-step", shape, "--device", check.device.type], env=env)
        if done.returncode:
            raise RuntimeError(f"torchrun exited with {done.returncode}")


def rank_step(shape: str, device_type: str) -> int:
    """A torchrun process: one step of the shape on this rank's device."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    tokenizer = load_tokenizer()
    check = Check(device, None)
    trainer = make_trainer(build_model(shape, device, tokenizer), tokenizer, device, preflight="off")
    try:
        with check.phase(f"rank {rank} step"):
            train_steps(trainer, check.counts, steps=1)
    finally:
        trainer.close()
        trainer.world.close()
    return 1 if check.failed else 0


def write_model(shape: str, tokenizer: object, folder: Path) -> Path:
    """The shape's random-weight model and the tokenizer as a Hugging Face folder, for the command line."""
    model = build_model(shape, torch.device("cpu"), tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return folder


def run_command(check: Check, name: str, argv: list[str], run_dir: Path | None = None) -> None:
    """One phase: ``argv`` in a fresh process (grpo's start-up order as a user's run has it: the memory
    check, init_world, the worker pools before CUDA); its steps' tokens and, from its preflight.json, its
    measured peak beside the prediction."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    with check.phase(name) as counts:
        counts.child = True
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stdout[-3000:] + done.stderr[-3000:], flush=True)
            raise RuntimeError(f"exited with {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}")
        if run_dir is not None:
            read_run(run_dir, counts)


def read_run(run_dir: Path, counts: Counts) -> None:
    """A run folder's steps (tokens, log-prob gaps) and its pre-flight's memory: predicted and measured."""
    group = summary_group_size(run_dir)
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line)
        if "optimizer_steps" in metrics:
            counts.add_step(metrics, group)
    report = run_dir / "preflight.json"
    memory = json.loads(report.read_text()).get("memory") or {} if report.exists() else {}
    counts.predicted = memory.get("predicted_peak_bytes")
    counts.measured = memory.get("measured_after_first_step_bytes")


MAIN_REWARD = """
import sys
from pathlib import Path
import grpo

def main_reward(completion, example):  # defined in __main__: its workers must fork before CUDA starts
    return float(len(completion) % 2)

folder, device, run_dir = sys.argv[1:4]
grpo.train(grpo.TrainConfig(model=folder, task="add", device=device, **{SMALL}), rewards=[main_reward],
           run_dir=Path(run_dir), progress=False)
"""


def user_paths(check: Check, shape: str, tokenizer: object, vllm: bool) -> None:
    """The paths a user's first GPU runs take, each in a fresh process: grpo train (memory check and
    init_world included) with --prompt-format r1-zero, --beta 0.04 and the final model saved; its resume;
    grpo eval of the saved model; LoRA with --beta 0.04; a reward defined in a script's __main__ (the
    Python API); --engine vllm with sleep mode and weight pushes (when vLLM is installed); and FSDP on
    one process (NCCL does not put two ranks on one GPU; several processes are tested on the CPU)."""
    work = Path(tempfile.mkdtemp(prefix="grpo-gpu-paths-"))
    try:
        folder = write_model(shape, tokenizer, work / "model")
        dev = check.device.type
        train = [sys.executable, "-m", "grpo", "train", "--model", str(folder), "--task", "add", "--device", dev,
                 "--rewards", f"{Path(__file__).resolve()}:first_char_parity", "--no-progress",
                 *[a for k, v in SMALL.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
        first = work / "r1-zero"
        run_command(check, f"cli r1-zero {shape}", [*train, "--prompt-format", "r1-zero", "--beta", "0.04",
                                                     "--save-model", "--save-every", "2", "--output", str(first)],
                    first)
        run_command(check, f"resume {shape}", [sys.executable, "-m", "grpo", "train", "--resume", str(first),
                                               "--steps", "3", "--no-progress"], first)
        run_command(check, f"eval {shape}", [sys.executable, "-m", "grpo", "eval", "--model", str(first / "model"),
                                             "--task", "add", "--eval-size", "8", "--max-new-tokens", "16",
                                             "--device", dev, "--no-progress"])
        lora = work / "lora"
        run_command(check, f"cli lora {shape}", [*train, "--lora-rank", "16", "--beta", "0.04", "--output", str(lora)],
                    lora)
        main = work / "main"
        code = MAIN_REWARD.replace("{SMALL}", repr(SMALL))
        run_command(check, f"main-reward {shape}", [sys.executable, "-c", code, str(folder), dev, str(main)], main)
        if vllm:
            engine = work / "vllm"
            run_command(check, f"cli vllm {shape}", [*train, "--engine", "vllm", "--vllm-sleep", "--output",
                                                     str(engine)], engine)
        else:
            print(f"{'cli vllm ' + shape:<18} skipped: --no-vllm", flush=True)
        fsdp = work / "fsdp"
        run_command(check, f"fsdp {shape}", [sys.executable, __file__, "--fsdp-run", str(folder), "--device", dev,
                                             "--run-dir", str(fsdp)], fsdp)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# what the path phases run: short, a few prompts, each step's groups able to differ (the parity reward)
SMALL = {"steps": 2, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 32, "eval_size": 8,
         "preflight_prompts": 4}


def fsdp_run(folder: str, device_type: str, run_dir: str) -> int:
    """A world of one process under FSDP (FSDP2 over a mesh of one device): the policy and its reference
    sharded, the run trained and its model saved, through the Python API with a World of its own."""
    import torch.distributed as dist

    from grpo import GRPOTrainer, TrainConfig
    from grpo.run.build import check_before_loading, resolve_run
    from grpo.run.process_setup import setup_process
    from grpo.system.distributed import World, backend_for

    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    config = TrainConfig(model=folder, task="add", device=str(device), beta=0.04, save_model=True, fsdp=True,
                         rewards=(f"{Path(__file__).resolve()}:first_char_parity",), **SMALL)
    setup_process(config)
    run = check_before_loading(resolve_run(config, processes=1), 1)
    dist.init_process_group(backend_for(device), init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    trainer = GRPOTrainer(run, progress=False, world=World(device=device, fsdp=True))
    try:
        from torch.distributed.fsdp import FSDPModule

        if not any(isinstance(m, FSDPModule) for m in trainer.policy.modules()):
            raise RuntimeError("the policy was not sharded")
        trainer.train(Path(run_dir))
    finally:
        trainer.close()
        dist.destroy_process_group()
    return 0


def load_tokenizer() -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


def peak_flops(device: torch.device, given: float) -> float | None:
    """The device's dense bf16 peak in FLOP/s: ``given`` TFLOP/s, else by the GPU's name; None on the CPU."""
    if given:
        return given * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for key, tflops in PEAK_TFLOPS.items() if key in name), None)


def header(check: Check) -> str:
    import transformers

    import grpo

    where = torch.cuda.get_device_name(check.device) if check.device.type == "cuda" else "CPU"
    peak = f"{check.peak_flops / 1e12:g} TFLOP/s" if check.peak_flops else "n/a"
    return (f"gpu_check on {where}: torch {torch.__version__}, transformers {transformers.__version__}, "
            f"grpo from {Path(grpo.__file__).parent}, MFU against {peak}")


def shape_phases(check: Check, shapes: list[str], tokenizer: object, *, torchrun: bool) -> None:
    """build, preflight, train and train-ckpt per shape through the Python API; checkpoint and resume on the
    smallest; one step by two processes with two GPUs (or ``torchrun``)."""
    for shape in shapes:
        check_shape(check, shape, tokenizer)
    checkpoint_and_resume(check, shapes[0], tokenizer)
    if torchrun or (check.device.type == "cuda" and torch.cuda.device_count() >= 2):
        torchrun_step(check, shapes[0])
    else:
        print(f"{'torchrun ' + shapes[0]:<18} skipped: fewer than 2 GPUs (--torchrun runs it anyway)", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="a two-layer Qwen2 instead of the 0.5B and 1.5B shapes")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="the device's peak for MFU (default: by name)")
    parser.add_argument("--torchrun", action="store_true", help="the two-process step also with fewer than 2 GPUs")
    parser.add_argument("--no-vllm", action="store_true", help="skip the --engine vllm path")
    parser.add_argument("--no-paths", action="store_true", help="skip the user paths")
    parser.add_argument("--paths-only", action="store_true", help="only the user paths (cli, resume, eval, lora, "
                        "__main__ reward, vllm, fsdp), on the smallest shape")
    parser.add_argument("--rank-step", default="", help=argparse.SUPPRESS)  # a torchrun process (internal)
    parser.add_argument("--fsdp-run", default="", help=argparse.SUPPRESS)  # the fsdp phase's process (internal)
    parser.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_step:
        return rank_step(args.rank_step, args.device)
    if args.fsdp_run:
        return fsdp_run(args.fsdp_run, args.device, args.run_dir)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu --tiny", flush=True)
        return 1
    if args.tiny:  # a tiny model gains nothing from threads, and they fight a busy machine's other work
        torch.set_num_threads(1)
    start = time.perf_counter()
    check = Check(device, peak_flops(device, args.peak_tflops))
    print(header(check), flush=True)
    tokenizer = load_tokenizer()
    shapes = ["tiny"] if args.tiny else ["0.5b", "1.5b"]
    if not args.no_paths:
        user_paths(check, shapes[0], tokenizer, vllm=not args.no_vllm)
    if not args.paths_only:
        shape_phases(check, shapes, tokenizer, torchrun=args.torchrun)
    seconds = time.perf_counter() - start
    if check.failed:
        print(f"gpu_check: FAILED {', '.join(check.failed)} ({seconds:.0f} s)", flush=True)
        return 1
    print(f"gpu_check: every phase passed in {seconds:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
