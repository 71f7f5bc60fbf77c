"""The memory check before the weights load: predict (grpo/run/memory.py), adapt, or refuse in one line.

``grpo train`` calls ``check_memory`` once the options and the task are known and before any weight
loads or any run folder exists. The model's shape comes from its config.json (the converted folder of
the embedded model or of a GGUF, a Hugging Face folder, a hub id already in the local cache) or, for a
GGUF not yet converted, from the file's metadata. When the prediction exceeds what is free (CPU:
MemAvailable in /proc/meminfo; CUDA: torch.cuda.mem_get_info, asked of a child interpreter so that this
process does not initialise CUDA before its reward and tool workers fork), options the user did not set change, in
this order, each printed: micro_batch_tokens halves (not below one row of prompt and completion), then
gradient checkpointing turns on, then eval_batch_size halves. ``--no-adapt`` turns this off. When that is
not enough, the run is refused with one line naming the largest term and the option that shrinks it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.config import ConfigError
from grpo.run.memory import predict
from grpo.run.memory_shapes import Device, ModelShape, Prediction, RunShape, estimate_prompt_tokens, gib

if TYPE_CHECKING:
    from grpo.sampling.step_parts import Sampling

# the option a user changes to shrink each term, for the refusal's line
SHRINKS = {
    "weights": "a smaller --model (or --nproc with --fsdp to shard it)",
    "optimizer": "--lora-rank (AdamW then keeps the adapter's moments only)",
    "gradients": "--lora-rank",
    "flat_gradients": "--lora-rank or --fsdp (the all-reduce's copies of the gradients)",
    "reference": "--beta 0 (no reference copy) or --lora-rank (the base is the reference)",
    "async_copy": "--async-lag 0",
    "teacher": "a smaller --teacher",
    "kv_cache": "--prompts-per-step, --group-size or --max-new-tokens",
    "sampling_logits": "--prompts-per-step or --group-size",
    "reordered_weights": "GRPO_REORDERED_WEIGHTS=0 (sampling then runs on the weights as they are, slower)",
    "activations": "--micro-batch-tokens or --gradient-checkpointing",
    "logits_chunk": "a model with a smaller vocabulary",
    "autocast_weights": "--lora-rank",
    "baseline": "nothing grpo can change (the interpreter and its libraries)",
    "tokenizer": "nothing grpo can change (the model's tokenizer)",
    "reward_workers": "--reward-workers",
    "tool_workers": "fewer tool workers",
    "vllm": "--vllm-memory",
    "push_buffer": "--vllm-bucket-mb",
    "save_buffer": "--no-save-model (the final model is then not written)",
    "gathered_weights": "more processes under --fsdp (each gathers the whole model in bf16 to sample)",
}
MIN_MICRO_BATCH = 256


def read_model_config(name: str) -> dict | None:
    """The model's config as a mapping, cheaply, without its weights; None when it cannot be had so
    (a hub id not in the local cache)."""
    from grpo.models import EMBEDDED, adapter_base, cache_dir, embedded_gguf

    path = Path(name).expanduser()
    if name == EMBEDDED:
        folder = cache_dir() / "models" / "SmolLM2-135M-Instruct"
        return _json(folder / "config.json") or gguf_config(embedded_gguf())
    if path.suffix == ".gguf":
        folder = cache_dir() / "models" / f"{path.stem}-{path.stat().st_size}"
        return _json(folder / "config.json") or gguf_config(path)
    if path.is_dir():
        if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
            return read_model_config(adapter_base(path, name))
        return _json(path / "config.json")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(name, local_files_only=True).to_dict()
    except (OSError, ValueError):
        return None


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def gguf_config(path: Path) -> dict:
    """A config.json's memory fields from a GGUF file's metadata (``{arch}.block_count`` and its kin)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents() if key in reader.fields else None  # noqa: E731
    arch = field("general.architecture")
    heads = field(f"{arch}.attention.head_count")
    hidden = field(f"{arch}.embedding_length")
    return {"model_type": arch, "num_hidden_layers": field(f"{arch}.block_count"), "hidden_size": hidden,
            "intermediate_size": field(f"{arch}.feed_forward_length"), "num_attention_heads": heads,
            "num_key_value_heads": field(f"{arch}.attention.head_count_kv") or heads,
            "head_dim": field(f"{arch}.attention.key_length") or hidden // heads,
            "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
            "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors)}


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None off Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def run_device(config: object, world: int) -> Device:
    """The device the run will train on and what is free for one of its processes: on CUDA the device's
    free memory; on the CPU MemAvailable shared by the processes of this machine."""
    import torch

    cuda = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    if cuda:
        index = int(config.device.split(":")[1]) if ":" in config.device else 0
        free, total = cuda_memory(index)
        return Device("cuda", world, free, total)
    available = mem_available()
    from grpo.sampling.packed_linear import packs_here

    return Device("cpu", world, None if available is None else available // world, mem_total(), packs_here())


def cuda_memory(index: int) -> tuple[int, int]:
    """GPU ``index``'s free and total bytes, read by a child interpreter: calling torch.cuda.mem_get_info
    here would initialise CUDA in this process, after which its reward and tool workers could no longer fork
    (grpo/system/workers.py) and a --nproc launcher would hold a context on the GPU for the whole run. The child
    sees the same CUDA_VISIBLE_DEVICES, so the index means the same GPU."""
    import subprocess
    import sys

    code = f"import torch; print(*torch.cuda.mem_get_info({int(index)}))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        free, total = (int(v) for v in out.stdout.split()[-2:])
    except (subprocess.SubprocessError, OSError, ValueError) as err:
        raise ConfigError(f"cannot read the free memory of cuda:{index}: {_last_line(err)}") from err
    return free, total


def _last_line(err: BaseException) -> str:
    text = (getattr(err, "stderr", None) or str(err)).strip()
    return text.splitlines()[-1] if text else type(err).__name__


def model_shape(raw: object) -> ModelShape | None:
    """The shape a config gives, or None when it lacks a size the model needs (an architecture whose
    config names them otherwise)."""
    if raw is None:
        return None
    try:
        return ModelShape.from_config(raw)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def with_teacher(run: RunShape, config: object) -> RunShape:
    """The run with its distillation teacher's parameters (read from its config, no weights): none without
    a teacher, or where the teacher is the reference's module (named as the model, with beta > 0 and no LoRA,
    whose reference is the base itself)."""
    from grpo.models import is_adapter_folder

    full = not config.lora_rank and not is_adapter_folder(str(config.model))
    if not config.teacher or (config.teacher == config.model and config.beta > 0 and full):
        return run
    shape = model_shape(read_model_config(config.teacher))
    return dataclasses.replace(run, teacher_params=shape.params if shape else 0)


def adapt_to_memory(model: ModelShape, config: object, prompt_tokens: int, device: Device,
                    adaptable: Collection[str], say: Callable[[str], None] = print) -> tuple[dict, Prediction]:
    """The changes that bring the predicted need under device.available, in order and only to
    ``adaptable`` options: micro_batch_tokens halved (while above one row and MIN_MICRO_BATCH), gradient
    checkpointing on, eval_batch_size halved (to 1); a change the later ones made needless undone; each
    change said. Returns the changes and the
    prediction after them; a need still over what is free raises ConfigError, one line naming the largest
    term and the option that shrinks it."""
    changes: dict = {}

    def now(trial: dict | None = None) -> Prediction:
        settled = dataclasses.replace(config, **(changes if trial is None else trial))
        return predict(model, with_teacher(RunShape.from_config(settled, prompt_tokens), settled), device)

    pred = now()
    fits = lambda p: device.available is None or p.needed <= device.available  # noqa: E731
    if fits(pred):
        return changes, pred
    floor = max(MIN_MICRO_BATCH, prompt_tokens + config.max_new_tokens)
    steps: list[tuple[str, object, Callable]] = [  # (option, its value now, the next smaller value or None), in order
        ("micro_batch_tokens", config.micro_batch_tokens, lambda v: v // 2 if v // 2 >= floor else None),
        ("gradient_checkpointing", config.gradient_checkpointing, lambda v: None if v else True),
        ("eval_batch_size", config.eval_batch_size, lambda v: v // 2 if v > 1 else None)]
    for name, value, smaller in steps:
        while name in adaptable and not fits(pred) and smaller(changes.get(name, value)) is not None:
            changes[name] = smaller(changes.get(name, value))
            pred = now()
    if not fits(pred):  # adapting is not enough: the one line says what to change, and nothing else is said
        raise ConfigError(refusal(pred, device.available))
    for name in list(changes)[:-1]:  # a change the later ones made needless is undone (a smaller
        # micro-batch does not help when evaluation is the peak)
        trial = {k: v for k, v in changes.items() if k != name}
        if fits(now(trial)):
            changes = trial
    pred = now()
    for name, value in changes.items():
        say(f"memory: {name} {getattr(config, name)} -> {value} (predicted need {gib(pred.needed)}, "
            f"{gib(device.available)} available)")
    return changes, pred


def refusal(pred: Prediction, available: int) -> str:
    """The one line that refuses a run that cannot fit."""
    name, size = pred.largest(1)[0]
    where = "each process needs" if pred.per_process else "the run needs"
    return (f"not enough memory: {where} about {gib(pred.needed)} at its peak ({pred.phase}) but {gib(available)} "
            f"is available; the largest term is {name} ({gib(size)}): shrink it with {SHRINKS.get(name, name)}")


def longest_prompt_chars(task: object) -> int:
    """The characters of the longest training prompt, its messages together."""
    rows = getattr(task, "train", [])
    return max((sum(len(str(m.get("content", ""))) for m in task.messages(r)) for r in rows), default=0)


def check_memory(config: object, task: object, world: int, adaptable: Collection[str] = ()) -> dict[str, object]:
    """The check before the weights load (see the module doc) on the resolved config: what it adapted, of
    the ``adaptable`` options (those the user did not give). A model whose config cannot be read cheaply is
    not checked (said once)."""
    raw = read_model_config(config.model)
    model = model_shape(raw)
    if model is None:
        print(f"memory: not checked before loading ({config.model}'s config does not say its sizes here)")
        return {}
    # few-shot examples are training rows written before every prompt
    prompt_tokens = estimate_prompt_tokens(longest_prompt_chars(task) * (1 + config.few_shot))
    device = run_device(config, world)
    changes, pred = adapt_to_memory(model, config, prompt_tokens, device, set(adaptable))
    check_host(pred, mem_available())
    return changes


def check_host(pred: Prediction, available: int | None) -> None:
    """A GPU run's host-memory terms (Prediction.host) against the host's free memory: ConfigError, one
    line, when they do not fit."""
    need = sum(pred.host.values())
    if available is None or need <= available:
        return
    name, size = max(pred.host.items(), key=lambda kv: kv[1])
    raise ConfigError(f"not enough host memory: the run needs about {gib(need)} of it beside the GPU but "
                      f"{gib(available)} is available; the largest term is {name} ({gib(size)}): shrink it "
                      f"with {SHRINKS.get(name, name)}")


def measured_completion(lengths: Sequence[int], truncated: Sequence[bool], multi_turn: bool) -> int:
    """The longest completion pre-flight measured, for the prediction beside the first step, where that
    is sound; 0 (assume the token limit) where it is not: no samples, a multi-turn run (its completions
    hold tool and environment replies), or any sample cut at the limit (the longest row of a batch
    decides its cache and each group's packing, so one cut row in the check means steps will have them)."""
    if not lengths or multi_turn or any(truncated):
        return 0
    return max(lengths)


def trainer_prediction(sampling: Sampling, lengths: Sequence[int] = (),
                       truncated: Sequence[bool] = ()) -> tuple[Prediction | None, int | None]:
    """The prediction for a run's sampling side (its model's config, its prompts' longest tokenisation, its
    settled config) and what is free for a process now. Given pre-flight's completion ``lengths`` (and
    which were ``truncated``), at those lengths where that is sound (``measured_completion``), with the
    peak at the token limit kept beside it (``Prediction.worst``)."""
    config, gen = sampling.config, sampling.generation
    raw = gen.model.config
    prompt_tokens = max((len(p) for p in sampling.train_prompts), default=0)
    if gen.device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(gen.device)
        # what the process holds already is its own, not another's: free plus its reserve
        device = Device("cuda", gen.world.size, free + torch.cuda.memory_reserved(gen.device), total)
    else:  # an equal share for each process on this host, plus what it holds: its weights are loaded by now
        free, local = mem_available(), int(os.environ.get("LOCAL_WORLD_SIZE", gen.world.size))
        share = None if free is None else free // local + resident()
        from grpo.sampling.packed_linear import packs_here

        device = Device("cpu", gen.world.size, share, mem_total(), packs_here())
    pool = getattr(gen.toolbox, "pool", None)
    run = with_teacher(RunShape.from_config(config, prompt_tokens, tool_workers=len(pool.workers) if pool else 0),
                       config)
    model = model_shape(raw)
    if model is None:
        return None, device.available
    worst = predict(model, run, device)
    measured = measured_completion(lengths, truncated, gen.agent is not None)
    if not measured or measured >= run.max_new_tokens:
        return worst, device.available
    at_lengths = predict(model, dataclasses.replace(run, completion_tokens=measured), device)
    return dataclasses.replace(at_lengths, worst=worst.peak if worst.peak != at_lengths.peak else 0), device.available


def resident() -> int:
    """This process's resident set now, in bytes (/proc/self/statm; 0 off Linux)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_line(pred: Prediction, available: int | None) -> str:
    """Pre-flight's memory line, with a warning when a process's predicted peak (CUDA: its reserve) is over
    what is available to it (trainer_prediction: its share of what is free plus what it holds). The
    processes beside it (reward and tool workers, vLLM) are running by then, out of what is free already;
    the weight push's buffer is not yet: it is host memory (/dev/shm), counted against a CPU's available
    memory only, not a GPU's (a CUDA prediction is the one with a reserve). Too late to adapt (the pre-load
    check does): it names the largest term and the option that shrinks it, as the check's refusal does."""
    push = pred.others.get("push_buffer", 0) if not pred.reserved else 0
    line, need = pred.describe(available), max(pred.peak, pred.reserved) + push
    if available is None or need <= available:
        return line
    name, size = max(pred.terms.items(), key=lambda kv: kv[1])
    return (f"{line}; warning: over what is available by {gib(need - available)}, so the run may be killed for "
            f"memory: the largest term is {name} ({gib(size)}): shrink it with {SHRINKS.get(name, name)}")


def measured_peak(device_type: str) -> int:
    """What this process has used at most so far: CUDA's max_memory_allocated, else the peak resident set
    (getrusage's ru_maxrss, in KiB on Linux)."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def say_measured_memory(memory: dict | None, step: int, device_type: str, run_dir: Path | None, *,
                        main: bool) -> dict | None:
    """After the first step: the pre-flight's predicted peak (``memory``; None: no check ran) beside what this
    process has used so far (peak resident set on a CPU, max_memory_allocated on CUDA), said by the ``main``
    process and kept in run_dir's preflight.json; the prediction with that measure added (a new dict)."""
    if memory is None or not main:
        return memory
    used = measured_peak(device_type)
    memory = {**memory, "measured_after_first_step_bytes": used}
    what = "max allocated" if device_type == "cuda" else "peak resident"
    worst = memory.get("worst_case_peak_bytes")
    limit = f" ({gib(worst)} if completions reach the token limit)" if worst else ""
    print(f"memory: after step {step}, {what} {gib(used)}; predicted peak "
          f"{gib(memory['predicted_peak_bytes'])}{limit}", flush=True)
    path = run_dir / "preflight.json" if run_dir is not None else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        saved["memory"] = memory
        path.write_text(json.dumps(saved, indent=2) + "\n")
    return memory
