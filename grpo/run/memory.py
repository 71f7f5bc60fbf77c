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

from grpo.run.memory_shapes import MIB, Device, ModelShape, Prediction, RunShape

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
