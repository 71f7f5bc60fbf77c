"""Memory before step 1: a run's peak, predicted from the model's config and the run's options.

A pure model, in bytes, of what one training process holds at the moment it holds the most. Each phase
of a run keeps the process's lasting state (the interpreter and libraries, the weights, the reference,
the optimiser's state once it exists) and adds its own transient part:

- sampling (the pre-flight check's round, a step's rounds): the KV cache of every row at once, 2 (keys
  and values) x rows x (prompt + new tokens) x layers x KV heads x head dimension x bytes (the own engine
  repeats each prompt's cache for its G rows, grpo/sampling/forward.py ``encode_prompt_batch``), and the decode
  step's logits, rows x V floats, a few times over (the softmax and the nucleus filter's copies);
- the update: the gradients, the activations of one micro-batch (at most micro_batch_tokens tokens;
  every pass that runs the model keeps within it) and one chunk of logits (grpo/learning/logprobs.py);
- evaluation: greedy decoding of eval_batch_size prompts, its own KV cache and logits.

The peak is the largest phase. On a CPU it is the resident set; on CUDA the allocated bytes, with the
caching allocator's reserve on top (``reserved``). Processes beside the trainer (vLLM, reward workers,
the weight-push buffer in /dev/shm) are counted separately: they add to what the machine must have, not to
the trainer's own peak. Under torchrun each process is predicted on its own (its share of the rows; under
FSDP its shard of the weights, gradients and optimiser state).

Deviations, stated: activations per token per layer are counted from a Llama-style block (norms, q/k/v/o,
a gated MLP), not traced; the prompt length is estimated before the tokenizer loads; peaks that do not
overlap (a reference pass and the backward) are not added.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2

# Measured on this project's CPU machine (docs/memory.md): python + torch + transformers + peft + grpo
# imported came to 359 MiB resident; the task's rows and the run's own objects on top, before any weight
# or tokenizer: the resident set every process starts with.
CPU_BASELINE = 400 * MIB
# A fast tokenizer's resident size follows its vocabulary: measured (docs/memory.md) 57 MiB for
# SmolLM2's 49,152 tokens (1.2 KB a token), 449 MiB for Gemma 3's 262,144 (1.8 KB); the larger rate.
TOKENIZER_BYTES_PER_TOKEN = 1800
# A CUDA context (kernels and cuBLAS workspace) is host and device memory outside the allocator's count;
# torch.cuda.max_memory_allocated does not see it: only the reserve check includes it.
CUDA_CONTEXT = 500 * MIB
# The caching allocator keeps freed blocks for reuse: its reserve runs above the allocated peak by a share.
CUDA_RESERVE_SLACK = 0.15
# A reward or tool worker: a forked interpreter; its own pages (what copy-on-write duplicates) only.
# Estimates, not measured (docs/memory.md): this, VLLM_PROCESS, CUDA_CONTEXT and CUDA_RESERVE_SLACK.
WORKER_BYTES = 120 * MIB
# vLLM's CPU process before its KV cache: the interpreter, torch, vLLM itself and a copy of the weights.
VLLM_PROCESS = 1500 * MIB
# On a GPU run these are host memory: the worker processes, the push buffer in /dev/shm (and the save buffer)
HOST_TERMS = ("reward_workers", "tool_workers", "push_buffer")
# The decode step's logits exist a few times over: the raw logits, the tempered softmax, top-p's sorted copy.
SAMPLING_LOGIT_COPIES = 3
# The log-prob head's chunk: a (chunk, V) block of logits and, in backward, its gradient in place, with
# the fp32 copy of the weight when the head runs in bf16; see grpo/learning/logprobs.py.
LOGIT_CHUNK_TOKENS = 256
LOGIT_CHUNK_COPIES = 2
# Gradient checkpointing's backward holds more than its count (the kept inputs and caches, the gradients
# whole, the re-run layer's set and its gradients): measured with bench/memory_probe.py (SmolLM2-135M,
# docs/memory.md) the surplus was 0.04 to 0.35 GiB at five sizes, growing with the completion's length at
# equal tokens; not explained. This bounds it per completion token of the micro-batch: the largest of the
# five, 0.35 GiB over 3,072 completion tokens (122 KB), rounded up to 125 KB, taken as a multiple of one
# token's layer inputs (L x H x bytes: 30 x 576 x 4 = 69,120 B on SmolLM2-135M in fp32), so that it
# scales with the model: 1.81 x 69,120 = 125,107 B. Fitted on one model, on a CPU (fp32).
CHECKPOINT_SURPLUS_LAYER_INPUTS = 1.81
# Copies of the gradients a multi-process step's all-reduce makes on a CPU: the flat one and gloo's own.
SYNC_COPIES_CPU = 2


# config.json model_type prefixes: four norms a layer (Gemma 2, 3); q/k norms (Gemma 3, Qwen3, OLMo 2)
SANDWICH_NORMS = ("gemma2", "gemma3")
QK_NORMS = ("gemma3", "qwen3", "olmo2")


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on in a decoder-only model: H hidden, I intermediate, heads and KV heads of
    head_dim each, V vocabulary, L layers; params the total (tied embeddings counted once)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    experts: int = 1  # a mixture of experts' experts per layer (their MLPs all held)
    expert_intermediate: int = 0
    norms: int = 2  # H-wide norms per layer: 2 in a Llama block, 4 in Gemma 2 and 3 (before and after each part)
    qk_norm: bool = False  # a norm on each head's queries and keys (Gemma 3, Qwen3, OLMo 2)

    @classmethod
    def from_config(cls, config: Mapping | object) -> ModelShape:
        """From a config.json mapping or a transformers config object (a multimodal config's text part)."""
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        text = get("text_config")
        if text:
            return cls.from_config(text)
        hidden = int(get("hidden_size") or get("n_embd") or get("d_model"))
        heads = int(get("num_attention_heads") or get("n_head"))
        experts = int(get("num_experts") or get("num_local_experts") or 1)
        kind = str(get("model_type") or "")
        return cls(
            layers=int(get("num_hidden_layers") or get("n_layer")),
            hidden=hidden,
            intermediate=int(get("intermediate_size") or get("n_inner") or 4 * hidden),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=int(get("head_dim") or hidden // heads),
            vocab=int(get("vocab_size")),
            tied=bool(get("tie_word_embeddings", True)),
            experts=experts,
            expert_intermediate=int(get("moe_intermediate_size") or 0) if experts > 1 else 0,
            norms=4 if kind.startswith(SANDWICH_NORMS) else 2,
            qk_norm=kind.startswith(QK_NORMS),
        )

    @property
    def layer_params(self) -> int:
        """One decoder layer: q and o (H x heads*d each), k and v (H x kv*d each), a gated MLP (3 H I, or
        one per expert and a router), two norms."""
        attn = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        if self.experts > 1:
            mlp = self.experts * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        else:
            mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + self.norms * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """P = V H (embeddings) + L x layer + H (final norm) + V H again when the output layer is untied."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * self.layer_params + self.hidden

    def lora_params(self, rank: int) -> int:
        """LoRA on every linear projection of the blocks: r x (in + out) each (q, k, v, o, gate, up, down)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        i = self.expert_intermediate * self.experts if self.experts > 1 else self.intermediate
        per_layer = rank * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)
        return self.layers * per_layer

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """The KV cache of one token: 2 (keys and values) x L x KV heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_floats_per_token(self) -> int:
        """Values one layer keeps for backward per token: the inputs of its norms and their outputs
        (2 H each: 4 H in a Llama block, 8 H in Gemma's), q, k, v before and after the rotary embedding
        (2 (H + 2 kv d)), the attention's output and the keys and values repeated to every head (3 H),
        gate, up, act(gate) and their product (4 I); with q/k norms, q and k before them (2 (q + kv))."""
        kv = self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        i = self.expert_intermediate if self.experts > 1 else self.intermediate
        qk = 2 * (q + kv) if self.qk_norm else 0
        return 2 * self.norms * self.hidden + 2 * (q + 2 * kv) + 3 * q + 4 * i + qk


@dataclass(frozen=True)
class Device:
    """Where the run trains: ``kind`` cpu or cuda, ``world`` processes (each on its own device or cores),
    ``available`` bytes free for one process now (None: unknown)."""

    kind: str = "cpu"
    world: int = 1
    available: int | None = None
    total: int = 0  # the host's or device's memory, what vLLM's share is a share of
    packs_weights: bool = False  # whether the own engine samples on a reordered copy of the weights (grpo/sampling/packed_linear.py)


@dataclass(frozen=True)
class Prediction:
    """One process's predicted peak and the terms of the phase it happens in; ``others`` the processes
    beside it (counted in ``needed``, what must be free); ``reserved`` CUDA's allocator reserve."""

    peak: int
    phase: str
    terms: dict[str, int]
    others: dict[str, int] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    reserved: int = 0
    per_process: bool = False
    worst: int = 0  # the peak with every completion at the token limit, when ``peak`` assumes measured lengths
    completion: int = 0  # the longest completion ``peak`` assumes, in tokens
    # on a GPU, what the run holds in host memory instead (reward and tool workers, the push buffer in
    # /dev/shm, the save buffer): checked against the host's free memory, not the GPU's
    host: dict[str, int] = field(default_factory=dict)

    @property
    def needed(self) -> int:
        """What must be free: the process's peak (its reserve on CUDA) and the processes beside it."""
        return max(self.peak, self.reserved) + sum(self.others.values())

    def largest(self, n: int = 3) -> list[tuple[str, int]]:
        everything = {**self.terms, **self.others}
        return sorted(everything.items(), key=lambda kv: -kv[1])[:n]

    def to_dict(self, available: int | None) -> dict:
        return {"predicted_peak_bytes": self.peak, "needed_bytes": self.needed, "available_bytes": available,
                "phase": self.phase, "terms": dict(self.terms), "other_processes": dict(self.others),
                "phases": dict(self.phases), "reserved_bytes": self.reserved or None,
                "per_process": self.per_process, "completion_tokens": self.completion,
                "worst_case_peak_bytes": self.worst or None, "host_bytes": dict(self.host)}

    def describe(self, available: int | None = None) -> str:
        who = "each process's" if self.per_process else "the trainer's"
        parts = ", ".join(f"{name} {gib(v)}" for name, v in self.largest())
        free = f" of {gib(available)} available" if available is not None else ""
        beside = f" (+{gib(sum(self.others.values()))} in other processes)" if self.others else ""
        beside += f" (+{gib(sum(self.host.values()))} of host memory)" if self.host else ""
        lengths = (f" at the completion lengths measured here (the longest {self.completion} tokens; "
                   f"{gib(self.worst)} if they reach the token limit)") if self.worst else ""
        return f"memory: {who} predicted peak {gib(self.peak)}{lengths}{beside}{free}, in {self.phase}: {parts}"


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def estimate_prompt_tokens(longest_chars: int, template_tokens: int = 64) -> int:
    """Prompt tokens before the tokenizer loads: a token for every 3 characters (English BPE averages
    about 4) plus the chat template's and system prompt's tokens."""
    return math.ceil(longest_chars / 3) + template_tokens


@dataclass(frozen=True)
class RunShape:
    """The options memory depends on, with the prompt length (estimated before the tokenizer loads)."""

    group_size: int
    prompts_per_step: int
    max_new_tokens: int
    prompt_tokens: int
    micro_batch_tokens: int
    gradient_checkpointing: bool = False
    beta: float = 0.0
    lora_rank: int = 0
    steps: int = 2
    optimizer_steps_per_step: int = 1  # minibatches x epochs
    eval_batch_size: int = 128
    eval_rows: int = 128  # the held-out prompts a process scores, at most
    eval_samples: int = 0
    preflight_rows: int = 0  # the pre-flight check's prompts x group_size (0: no check)
    async_lag: int = 0
    engine: str = "own"
    vllm_memory: float = 0.0  # 0: sized by vllm_share
    vllm_bucket_mb: float = 1024.0
    reward_workers: int = 2
    tool_workers: int = 0
    fsdp: bool = False
    save_model: bool = True
    round_prompts: int = 0  # the most prompts one generation round decodes at once (0: prompts_per_step)
    # the longest completion assumed in sampling and in the update's micro-batches (0: max_new_tokens, the
    # worst case the check before loading must assume); pre-flight's measured lengths set it
    completion_tokens: int = 0
    teacher_params: int = 0  # a distillation teacher's parameters, held beside the policy (0: none, or the reference)

    @property
    def completion(self) -> int:
        """Tokens of the longest completion the prediction assumes: completion_tokens, at most the limit."""
        return min(self.completion_tokens or self.max_new_tokens, self.max_new_tokens)

    @classmethod
    def from_config(cls, config: object, prompt_tokens: int, *, tool_workers: int = 0) -> RunShape:
        """From a settled TrainConfig (its token limit known). An adapter folder as ``--model`` trains its
        adapter, at the folder's rank, as ``--lora-rank`` would (grpo.models.adapter_folder_rank)."""
        from grpo.models import adapter_folder_rank

        rank = config.lora_rank or adapter_folder_rank(str(config.model))
        return cls(
            group_size=config.group_size, prompts_per_step=config.prompts_per_step, round_prompts=config.round_cap,
            max_new_tokens=config.max_new_tokens, prompt_tokens=prompt_tokens,
            micro_batch_tokens=config.micro_batch_tokens, gradient_checkpointing=config.gradient_checkpointing,
            beta=config.beta, lora_rank=rank, steps=config.steps,
            optimizer_steps_per_step=config.minibatches * config.epochs, eval_batch_size=config.eval_batch_size,
            eval_rows=config.eval_size, eval_samples=config.eval_samples,
            preflight_rows=0 if config.preflight == "off" else config.preflight_prompts * config.group_size,
            async_lag=config.async_lag, engine=config.engine, vllm_memory=config.vllm_memory,
            vllm_bucket_mb=config.vllm_bucket_mb, reward_workers=config.reward_workers,
            tool_workers=tool_workers, fsdp=config.fsdp,
            save_model=config.save_model)


def lasting_terms(model: ModelShape, run: RunShape, device: Device) -> dict[str, int]:
    """What a process holds through the run: weights 4 P (fp32; a 1/world shard under FSDP, plus one
    gathered layer), the reference's 4 P when beta > 0 (LoRA's reference is its base: nothing),
    AdamW's two moments 8 P_train (P_train: the LoRA adapter's r (in + out) per projection, else P), and
    under async_lag the sampler's copy of the policy (the own engine's 4 P) and one snapshot of the
    weights it samples with (4 P_train; vLLM's: 4 P)."""
    shard = device.world if run.fsdp else 1
    trained = model.lora_params(run.lora_rank) if run.lora_rank else model.params
    weights = model.params + trained if run.lora_rank else model.params
    terms = {"baseline": CPU_BASELINE if device.kind == "cpu" else 0,
             "tokenizer": TOKENIZER_BYTES_PER_TOKEN * model.vocab if device.kind == "cpu" else 0,
             "weights": int(4 * weights / shard) + (4 * model.layer_params if shard > 1 else 0),
             "optimizer": int(8 * trained / shard)}
    if run.beta > 0 and not run.lora_rank:
        terms["reference"] = int(4 * model.params / shard)
    if run.teacher_params:  # the frozen teacher, fp32 as loaded (grpo/learning/teacher/scoring.py)
        terms["teacher"] = 4 * run.teacher_params
    if run.async_lag:
        own = run.engine == "own"
        terms["async_copy"] = 4 * (weights if own else 0) + 4 * (trained if own else model.params)
    return terms


def kv_cache_bytes(model: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """2 x rows x tokens x L x KV heads x head_dim x bytes: the own engine's cache, each prompt's held once
    per completion of its group (grpo/sampling/forward.py repeats it G times)."""
    return rows * tokens * model.kv_bytes_per_token(dtype_bytes)


def sampling_terms(model: ModelShape, rows: int, tokens: int, dtype_bytes: int, device: Device,
                   reordered: bool = True, fsdp: bool = False) -> dict[str, int]:
    """A decoding round of ``rows`` rows at once: their KV cache at its longest, the decode step's
    logits, rows x V fp32 floats SAMPLING_LOGIT_COPIES times, and on a CPU that reorders them
    (grpo/sampling/packed_linear.py; ``reordered``: on the main thread) a copy of the linear layers' fp32 weights,
    L x layer + V H (the output layer; a layer's norms counted too). On a GPU the keys are fp32 (the
    rotary embedding multiplies bf16 keys by fp32 cos and sin: the cache is 1.5 times a bf16 one), and
    the layers' weights are there in bf16 as well: autocast's copies (2 bytes per layer parameter), or
    under FSDP the whole model gathered in bf16 for the round (2 P)."""
    kv = kv_cache_bytes(model, rows, tokens, dtype_bytes)
    terms = {"kv_cache": kv * 3 // 2 if device.kind == "cuda" else kv,
             "sampling_logits": SAMPLING_LOGIT_COPIES * rows * model.vocab * 4}
    if device.kind == "cuda":
        terms["gathered_weights" if fsdp else "autocast_weights"] = (
            2 * model.params if fsdp else 2 * model.layers * model.layer_params)
    if device.kind == "cpu" and device.packs_weights and reordered:
        terms["reordered_weights"] = 4 * (model.layers * model.layer_params + model.vocab * model.hidden)
    return terms


def micro_batch_tokens(run: RunShape, groups: int) -> tuple[int, int]:
    """(tokens, rows) of the largest micro-batch of ``groups`` groups: whole groups packed up to
    micro_batch_tokens, each group costing its prompt once plus G x its longest completion
    (grpo/learning/update.py ``micro_batches``), with every group's longest completion at ``run.completion``; a
    group over the budget is split by rows (at least one)."""
    p, t, g = run.prompt_tokens, run.completion, run.group_size
    group_cost = p + g * t
    if group_cost > run.micro_batch_tokens:
        rows = max(1, (run.micro_batch_tokens - p) // max(t, 1))
        rows = min(rows, g)
        return p + rows * t, rows
    fit = max(1, min(groups, run.micro_batch_tokens // group_cost))
    return fit * group_cost, fit * g


def activation_bytes(model: ModelShape, run: RunShape, tokens: int, rows: int, dtype_bytes: int) -> int:
    """Activations one micro-batch keeps for backward: tokens x L x (values per token per layer) x bytes
    (``ModelShape.activation_floats_per_token``), and the prompt's KV cache repeated for each row.
    With gradient checkpointing, ``checkpointed_bytes``."""
    if run.gradient_checkpointing:
        return checkpointed_bytes(model, run, tokens, rows, dtype_bytes)
    per_layer = tokens * model.activation_floats_per_token() * dtype_bytes
    return model.layers * per_layer + kv_cache_bytes(model, rows, run.prompt_tokens, dtype_bytes)


def checkpointed_bytes(model: ModelShape, run: RunShape, tokens: int, rows: int, dtype_bytes: int) -> int:
    """What a checkpointed micro-batch holds at its backward's peak, counted from grpo/learning/logprobs.py
    ``_checkpointed`` and grpo/sampling/forward.py ``select_rows``: each layer's input (tokens x L x H), the KV
    cache as the layers extend it (rows x (prompt + completion)), the prompt's cache repeated for each row
    twice (the repeat, and ``select_rows``' copy kept as the re-run's ``before``); then, in backward, the
    re-run layer's set and its gradients (2 x tokens x one layer's values), and the measured surplus
    ``checkpoint_surplus_per_token`` per completion token (rows x completion)."""
    per_layer = tokens * model.activation_floats_per_token() * dtype_bytes
    kept = (tokens * model.layers * model.hidden * dtype_bytes
            + kv_cache_bytes(model, rows, run.prompt_tokens + run.completion, dtype_bytes)
            + 2 * kv_cache_bytes(model, rows, run.prompt_tokens, dtype_bytes))
    return kept + 2 * per_layer + checkpoint_surplus_per_token(model, dtype_bytes) * rows * run.completion


def checkpoint_surplus_per_token(model: ModelShape, dtype_bytes: int) -> int:
    """Checkpointing's measured backward surplus per completion token: CHECKPOINT_SURPLUS_LAYER_INPUTS
    times one token's layer inputs, L x H x dtype bytes (125,107 B on SmolLM2-135M in fp32)."""
    return int(CHECKPOINT_SURPLUS_LAYER_INPUTS * model.layers * model.hidden * dtype_bytes)


def update_terms(model: ModelShape, run: RunShape, device: Device, groups: int,
                 *, first_only: bool = False) -> dict[str, int]:
    """The update's transient part, its micro-batches packed from ``groups`` groups: gradients 4 P_train
    (a 1/world shard under FSDP; with a single micro-batch, or when only the first runs as pre-flight's
    timing does, only what they exceed its activations by, and at least the output layer's 4 V H,
    which backward makes first), one
    micro-batch's activations, one chunk of the log-prob head's logits
    (LOGIT_CHUNK_TOKENS x V fp32, twice), and on CUDA autocast's bf16 copies of the layers' weights (2
    bytes per parameter outside the embeddings)."""
    shard = device.world if run.fsdp else 1
    trained = model.lora_params(run.lora_rank) if run.lora_rank else model.params
    act = 4 if device.kind == "cpu" else 2
    tokens, rows = micro_batch_tokens(run, groups)
    activations = activation_bytes(model, run, tokens, rows, act)
    gradients = int(4 * trained / shard)
    if first_only or groups * (run.prompt_tokens + run.group_size * run.completion) <= run.micro_batch_tokens:
        # one micro-batch: its gradients come into being in backward as its activations go (the optimiser
        # set them to None), so only what they exceed the activations by adds to the peak; but the output
        # layer's, V x H (the embeddings' when tied), comes first, while every activation is alive
        # Under checkpointing backward frees little (measured: it adds the gradients whole)
        head = 0 if run.lora_rank else int(4 * model.vocab * model.hidden / shard)
        if not run.gradient_checkpointing:
            gradients = max(head, gradients - activations)
    terms = {"gradients": gradients, "activations": activations,
             "logits_chunk": LOGIT_CHUNK_COPIES * LOGIT_CHUNK_TOKENS * model.vocab * 4}
    if device.kind == "cuda":
        terms["autocast_weights"] = 2 * model.layers * model.layer_params // shard
    return terms


def sync_terms(model: ModelShape, run: RunShape, device: Device) -> dict[str, int]:
    """Summing the gradients over processes without FSDP (grpo/system/distributed.py ``sync_gradients``): the
    gradients (4 P_train), their flat copy for one all-reduce (4 P_train), and on a CPU gloo's working
    buffer, taken as one more copy (the 2-process run's measured peak lies between two copies and three,
    docs/memory.md)."""
    trained = model.lora_params(run.lora_rank) if run.lora_rank else model.params
    copies = SYNC_COPIES_CPU if device.kind == "cpu" else 1
    return {"gradients": 4 * trained, "flat_gradients": copies * 4 * trained}


def saving_terms(model: ModelShape, run: RunShape) -> dict[str, int]:
    """Writing the final model: safetensors serialises every tensor's bytes before it writes (4 P); a
    LoRA policy is first copied and merged (4 P more, the adapter's 4 P_lora with it)."""
    terms = {"save_buffer": 4 * model.params}
    if run.lora_rank:
        terms["merged_copy"] = 4 * (model.params + model.lora_params(run.lora_rank))
    return terms


def other_processes(model: ModelShape, run: RunShape, device: Device) -> dict[str, int]:
    """Processes beside the trainer, on the same host (or device): reward and tool workers (each a
    forked interpreter's own pages; one forker per pool); vLLM's process on a CPU (its interpreter and
    weights, and vllm_memory x host memory for its KV cache) or its vllm_memory share of a GPU; the weight
    push's shared-memory buffer (full fine-tuning: vllm_bucket_mb, in /dev/shm)."""
    others = {}
    if run.reward_workers:
        others["reward_workers"] = (run.reward_workers + 1) * WORKER_BYTES
    if run.tool_workers:
        others["tool_workers"] = (run.tool_workers + 1) * WORKER_BYTES
    if run.engine == "vllm":
        from grpo.sampling.vllm_device import vllm_share

        rows = max(1, -(-(run.round_prompts or run.prompts_per_step) // device.world)) * run.group_size
        share = int(vllm_share(model, rows, run.prompt_tokens + run.max_new_tokens, device, run.vllm_memory)
                    * device.total)
        others["vllm"] = VLLM_PROCESS + 4 * model.params + share if device.kind == "cpu" else share
        if not run.lora_rank:
            others["push_buffer"] = int(run.vllm_bucket_mb * MIB)
    return others


def predict(model: ModelShape, run: RunShape, device: Device) -> Prediction:
    """The largest phase of one process: lasting state plus the phase's own part. Phases: the pre-flight
    round and its timed update of one micro-batch (no optimiser state yet), a step's sampling (its largest round: round_prompts/world x G rows; optimiser state from step 2), the
    update (gradients, activations; with AdamW's moments once one optimiser step is behind it), the
    evaluation (eval_batch_size prompts x n samples, at most its share of eval_size). vLLM samples in its
    own process: the trainer then holds no KV cache."""
    lasting = lasting_terms(model, run, device)
    act = 4 if device.kind == "cpu" else 2
    context = max(run.prompt_tokens + run.completion, 1)
    no_adam = {k: v for k, v in lasting.items() if k != "optimizer"}
    own = run.engine == "own"
    phases: dict[str, dict[str, int]] = {}
    if run.preflight_rows and own:
        phases["the pre-flight round"] = {**no_adam, **sampling_terms(model, run.preflight_rows, context, act, device,
                                                                      fsdp=run.fsdp)}
    if run.preflight_rows:  # it times a forward and backward of its first micro-batch only, of all its groups
        phases["the pre-flight's timed update"] = {**no_adam, **update_terms(
            model, run, device, run.preflight_rows // run.group_size, first_only=True)}
    if own:
        rows = max(1, -(-(run.round_prompts or run.prompts_per_step) // device.world)) * run.group_size  # the first ranks' share
        before = lasting if run.steps >= 2 else no_adam
        phases["sampling"] = {**before, **sampling_terms(model, rows, context, act, device, fsdp=run.fsdp,
                                                           reordered=not run.async_lag)}  # a thread's: none
    later = run.steps >= 2 or run.optimizer_steps_per_step > 1
    groups = max(1, run.prompts_per_step // device.world)
    phases["the update"] = {**(lasting if later else no_adam), **update_terms(model, run, device, groups)}
    eval_rows = min(run.eval_batch_size, max(1, math.ceil(run.eval_rows / device.world))) * max(1, run.eval_samples)
    if run.eval_rows:  # greedy evaluation decodes on the trainer's own policy, whatever the engine; its
        # lengths are not the sampled ones pre-flight measured: at the limit
        limit = max(run.prompt_tokens + run.max_new_tokens, 1)
        phases["evaluation"] = {**(lasting if run.steps else no_adam),
                                **sampling_terms(model, eval_rows, limit, act, device, fsdp=run.fsdp)}
    if device.world > 1 and not run.fsdp:
        phases["the gradient sync"] = {**(lasting if later else no_adam), **sync_terms(model, run, device)}
    if run.save_model:
        phases["saving the model"] = {**lasting, **saving_terms(model, run)}
    others, host = other_processes(model, run, device), {}
    if device.kind == "cuda":  # host memory, not the GPU's: counted apart
        host = {k: others.pop(k) for k in HOST_TERMS if k in others}
        host.update((k, phases["saving the model"].pop(k)) for k in ("save_buffer",) if "saving the model" in phases)
    phase = max(phases, key=lambda k: sum(phases[k].values()))
    terms = phases[phase]
    peak = sum(terms.values())
    reserved = int(peak * (1 + CUDA_RESERVE_SLACK)) + CUDA_CONTEXT if device.kind == "cuda" else 0
    return Prediction(peak=peak, phase=phase, terms=terms, others=others,
                      phases={k: sum(v.values()) for k, v in phases.items()}, reserved=reserved,
                      per_process=device.world > 1, completion=run.completion, host=host)
