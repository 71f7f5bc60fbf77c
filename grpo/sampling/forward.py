"""The decoder run over a batch of prompts with a KV cache, each prompt once for its whole group.

What sampling (grpo/sampling/rollout.py) and the training pass (grpo/learning/logprobs.py)
share: left padding, position ids, the shared-prefix encoding of B prompts
repeated over their G rows, the cache argument's name across transformers
versions, and the checks and attention settings both paths need.

Shape legend: B prompts, G samples per prompt, N = B*G, L prompt tokens,
T completion tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.sampling.packed_linear import linear


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-pad token lists; return ids (B, L) and attention mask (B, L)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, width - len(p) :] = 1
    return ids.to(device), attn.to(device)


def positions(attn: Tensor) -> Tensor:
    return (attn.cumsum(dim=-1) - 1).clamp(min=0)


class TokenEmbeddings:
    """The input embeddings of every token a pass uses, looked up in one call.

    Each call of the input embedding costs a dense (V, H) gradient in
    backward, zeroed and then added into the weight's. A pass that runs the
    decoder several times (shared prefix, prompts, length buckets) instead
    looks its distinct tokens up once and indexes that small table.
    """

    def __init__(self, model: nn.Module, ids: Tensor) -> None:
        self.vocab = torch.unique(ids)  # sorted
        self.table = model.get_input_embeddings()(self.vocab)  # (U, H)

    def __call__(self, ids: Tensor) -> Tensor:
        # F.embedding, not self.table[...]: the same rows, but the indexing's backward (index_put_ with
        # accumulate) sums repeated tokens in a thread-dependent order on the CPU, so that two runs with
        # several threads differed (by ~4e-9 after 4 steps); embedding's backward sums in a fixed order
        return F.embedding(torch.searchsorted(self.vocab, ids), self.table)


@dataclass
class PromptState:
    """The prompts' KV cache and what continues from it, one row per sequence."""

    cache: object  # a transformers Cache holding the prompt keys/values of every row
    last_hidden: Tensor  # (rows, H) final hidden state at each prompt's last token
    attn: Tensor  # (rows, L) key mask over the cached positions
    next_pos: Tensor  # (rows,) position id of the first completion token


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens shared by every prompt from the start (a system prompt, a template), leaving
    each prompt at least one token of its own."""
    shortest = min(len(p) for p in prompts)
    n = 0
    while n < shortest - 1 and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


@functools.cache
def _cache_arg(decoder_class: type) -> str:
    """The decoder's name for the KV cache: ``cache`` since transformers renamed it, ``past_key_values``
    before (5.16-5.2x). Passing the wrong one would not fail: forward's **kwargs would swallow it."""
    params = inspect.signature(decoder_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def decode(decoder: nn.Module, cache: object = None, **inputs: object) -> object:
    """``decoder(**inputs)`` with ``cache`` passed under the decoder's name for it; the output's
    cache is ``.cache`` on the output whichever name the library uses."""
    name = _cache_arg(type(decoder))
    out = decoder(**inputs, **({name: cache} if cache is not None else {}))
    if name != "cache":
        out.cache = out.past_key_values
    return out


def encode_prompt_batch(
    decoder: nn.Module, prompts: list[list[int]], repeats: int, pad_id: int, embed: TokenEmbeddings | None = None,
    token_budget: int = 0,
) -> PromptState:
    """Run B prompts once and repeat their state for the G sequences of each group.

    Two levels of sharing: the prefix common to the whole batch (typically
    the chat template's system prompt) is computed once for all B prompts,
    then each prompt's own part once for its G samples. Autograd sees the
    repeats as index operations, so gradients through the cache are exact
    (summed over the rows that share it). Layout of a row's keys:
    [shared prefix][left padding][own part] ([left padding][prompt] for a
    model with a sliding window, see ``has_sliding_window``). With ``embed``
    the input embeddings come from that table instead of the decoder's own lookup.
    ``token_budget`` (0: none): the prompts' own parts run in calls of at most that many
    tokens (rows x padded width, at least one row a call), their caches then joined.
    """
    device = next(decoder.parameters()).device

    def inputs(ids: Tensor) -> dict[str, Tensor]:
        return {"input_ids": ids} if embed is None else {"inputs_embeds": embed(ids)}

    shared, prefix_cache = shared_prefix(decoder, prompts, inputs, device)
    ids, own_attn = left_pad([p[shared:] for p in prompts], pad_id, device)  # (B, S)
    attn = torch.cat([own_attn.new_ones((len(prompts), shared)), own_attn], dim=1)  # (B, L)
    pos = positions(attn)[:, shared:]
    rows = len(prompts) if token_budget <= 0 else max(1, token_budget // ids.shape[1])
    caches, hidden = [], []
    for i in range(0, len(prompts), rows):
        j = min(i + rows, len(prompts))
        cache = None if prefix_cache is None else select_rows(prefix_cache, torch.zeros(j - i, dtype=torch.long))
        out = decode(decoder, cache, **inputs(ids[i:j]), attention_mask=attn[i:j], position_ids=pos[i:j],
                     use_cache=True)
        caches.append(out.cache)
        hidden.append(out.last_hidden_state[:, -1])
    cache = join_caches(caches)
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)
    return PromptState(
        cache=cache,
        last_hidden=torch.cat(hidden).repeat_interleave(repeats, dim=0),
        attn=attn.repeat_interleave(repeats, dim=0),
        next_pos=(pos[:, -1] + 1).repeat_interleave(repeats),
    )


def shared_prefix(decoder: nn.Module, prompts: list[list[int]], inputs: Callable[[Tensor], dict[str, Tensor]],
                  device: torch.device) -> tuple[int, object | None]:
    """The length of the prefix common to the whole batch and its cache, run once; (0, None) when under 8
    tokens are shared (or a sliding window)."""
    # a sliding window counts keys by their place in the cache, so padding between the shared prefix and a
    # prompt's own part would shift what the window sees: such models pad on the left only (contiguous rows)
    shared = common_prefix_length(prompts) if len(prompts) > 1 and not has_sliding_window(decoder) else 0
    prefix_cache = None
    if shared >= 8:
        prefix = torch.tensor([prompts[0][:shared]], device=device)  # (1, P)
        prefix_cache = decode(decoder, **inputs(prefix), use_cache=True).cache
    else:
        shared = 0
    return shared, prefix_cache


def join_caches(caches: list[object]) -> object:
    """One cache holding the rows of ``caches`` (same layers, same key length) in order: the first one,
    its keys and values extended in place."""
    first = caches[0]
    if len(caches) > 1:
        for index, layer in enumerate(first.layers):
            layer.keys = torch.cat([c.layers[index].keys for c in caches])
            layer.values = torch.cat([c.layers[index].values for c in caches])
    return first


@dataclass(frozen=True)
class LogitTransform:
    """What a model does to lm_head's output before the softmax: y = cap * tanh(scale * z / cap).

    ``scale`` multiplies (Granite divides by ``logits_scaling``; Cohere multiplies by ``logit_scale``),
    ``softcap`` bounds the logits (Gemma 2's ``final_logit_softcapping``). The fast paths compute
    logits from the final hidden state themselves, so they apply this as the model's forward does.
    """

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and not self.softcap

    def __call__(self, logits: Tensor) -> Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def slope(self, out: Tensor) -> Tensor | float:
        """dy/dz at the transformed logits ``out`` (y): scale * (1 - (y / cap)^2); a number without a cap."""
        if not self.softcap:
            return self.scale
        return (1.0 - (out / self.softcap).square()).mul_(self.scale)


NO_TRANSFORM = LogitTransform()


def logit_transform(model: nn.Module) -> LogitTransform:
    """The model's logit soft-cap and scaling, read from its config (identity when it has none)."""
    cfg = getattr(model, "config", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    divide = getattr(cfg, "logits_scaling", None)
    multiply = getattr(cfg, "logit_scale", None)
    scale = (1.0 / divide if divide else 1.0) * (multiply if multiply else 1.0)
    return LogitTransform(float(scale), float(cap) if cap else None)


class OutputHead(nn.Module):
    """lm_head followed by the model's logit transform: the logits the model's own forward returns."""

    def __init__(self, lm_head: nn.Module, transform: LogitTransform) -> None:
        super().__init__()
        self.lm_head, self.transform = lm_head, transform

    def forward(self, hidden: Tensor) -> Tensor:
        return self.transform(self.lm_head(hidden))


def output_head(model: nn.Module) -> nn.Module:
    """What turns the final hidden state into the logits: lm_head, with the soft-cap or scaling if any."""
    check_supported(model)
    transform, head = logit_transform(model), model.get_output_embeddings()
    return head if transform.identity else OutputHead(head, transform)


def head_logits(hidden: Tensor, lm_head: nn.Module) -> Tensor:
    """The output layer in fp32 whatever the autocast dtype: h.float() @ W.float()^T (+ b), then the
    model's soft-cap or scaling when ``lm_head`` is an :class:`OutputHead`; (n, H) -> (n, V).

    The sampler and the training pass both take their logits here. Under
    bf16 autocast (the CUDA path) a bf16 head rounds every logit to 8 bits of
    mantissa and rounds the hidden state it reads, so two passes whose hidden
    states differ in their last fp32 bits (the decode step's kernels against
    the training pass's) give log-probs apart by up to ~1e-2: the
    sampler/trainer ratio where GRPO runs collapse. MiniMax-M1 (2025, section
    3.2) computes its LM head in fp32 for this reason. The module's forward
    (and any hook on it) is bypassed, as the training pass's fused
    log-softmax (grpo/learning/logprobs.py) does.
    """
    transform = NO_TRANSFORM
    if isinstance(lm_head, OutputHead):  # the model's soft-cap or scaling, applied to the fp32 logits
        lm_head, transform = lm_head.lm_head, lm_head.transform
    bias = getattr(lm_head, "bias", None)
    with torch.autocast(hidden.device.type, enabled=False):
        return transform(linear(hidden.float(), lm_head.weight.float(), None if bias is None else bias.float()))


def has_sliding_window(model: nn.Module) -> bool:
    """Whether some attention layers see only the latest ``sliding_window`` keys (Gemma 2 and 3, Mistral).

    Those windows count cache slots, padding included, so the fast paths keep every row's tokens
    contiguous for them: no shared prefix before a prompt's padding, no padding between turns.
    """
    cfg = getattr(model, "config", None)
    kinds = getattr(cfg, "layer_types", None)
    return getattr(cfg, "sliding_window", None) is not None and (kinds is None or "sliding_attention" in kinds)


def check_supported(model: nn.Module) -> None:
    """Refuse, in one line, what the fast paths cannot compute as the model's forward does."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no linear output layer (lm_head); not supported")


@contextmanager
def grouped_kv_attention(device: torch.device) -> Iterator[None]:
    """On the CPU, let SDPA attend grouped key/value heads itself (``enable_gqa``) instead of
    transformers repeating every key and value for each query head first.

    Same results; the training pass no longer keeps those repeated copies for
    backward (about 160 MB for 16 completions of the embedded model). CUDA
    keeps transformers' choice: its fast kernels take grouped heads only without a mask.
    """
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    if device.type != "cpu" or key in os.environ:
        yield
        return
    os.environ[key] = "1"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def select_rows(cache: object, rows: Tensor) -> object:
    """A cache holding the given rows of ``cache``, which is left as it is (autograd flows through)."""
    sub = copy.copy(cache)
    sub.layers = [copy.copy(layer) for layer in cache.layers]
    sub.batch_select_indices(rows)
    return sub

