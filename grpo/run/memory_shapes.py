"""The records the memory model (grpo/run/memory.py) reads and returns: the model's shape (from its config.json),
the run's options that memory depends on, the device, and the predicted peak with its terms."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2


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
