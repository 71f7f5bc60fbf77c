"""The training pass: per-token log-probs of a rollout under the current policy, with gradients.

Every group repeats one prompt G times, so the prompt is run once and its
KV cache repeated over the G completions (grpo/sampling/forward.py); the gradient
flows back through the shared cache into the prompt's forward pass, summed
over the G completions, so it is exact. Completions run in buckets of
similar length, and only the policy's own tokens reach the output layer,
whose log-softmax is computed a chunk of rows at a time (``token_logprobs``).

Shape legend: B prompts, G samples per prompt, N = B*G, M scored tokens,
T completion tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from grpo.sampling.forward import (
    NO_TRANSFORM,
    LogitTransform,
    TokenEmbeddings,
    decode,
    encode_prompt_batch,
    grouped_kv_attention,
    left_pad,
    logit_transform,
    positions,
    select_rows,
)
from grpo.sampling.rollout import Rollout


class _LinearLogprob(torch.autograd.Function):
    """log softmax(f(h W^T) / temperature)[target] per row, chunk by chunk, never holding all the logits;
    f is the model's logit transform (soft-cap, scaling; grpo/sampling/forward.py LogitTransform).

    Forward keeps only h and each row's log-sum-exp; backward recomputes a
    chunk's logits and turns them into their gradient in place,
    (onehot - softmax) * g / temperature * f'(z), so a chunk costs one (c, V)
    buffer in each direction (two with a soft-cap, whose slope varies per
    logit). The entropy output carries no gradient. Logits and both gradients
    are computed in fp32 outside autocast, as the sampler's
    (``grpo.sampling.forward.head_logits``): the same log-probs whatever the autocast
    dtype, and backward is the exact gradient of forward. A bf16 weight (FSDP's
    mixed precision) is cast once per call, not per chunk.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, with_entropy, transform):  # noqa: ANN001, ANN205
        m = hidden.shape[0]
        logp, lse_all = hidden.new_empty(m, dtype=torch.float32), hidden.new_empty(m, dtype=torch.float32)
        entropy = hidden.new_zeros(m if with_entropy else 0, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            weight32 = weight.float()
            for i in range(0, m, chunk):
                logits = _logits(hidden[i : i + chunk], weight32, temperature, transform)  # (c, V)
                lse = torch.logsumexp(logits, dim=-1)
                logp[i : i + chunk] = logits.gather(1, targets[i : i + chunk].unsqueeze(1)).squeeze(1) - lse
                lse_all[i : i + chunk] = lse
                if with_entropy:
                    weighted = (logits - lse.unsqueeze(1)).exp_().mul_(logits)  # softmax * logits
                    entropy[i : i + chunk] = lse - weighted.sum(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, lse_all)
        ctx.temperature, ctx.chunk, ctx.transform = temperature, chunk, transform
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):  # noqa: ANN001, ANN205
        hidden, weight, targets, lse_all = ctx.saved_tensors
        scale = 1.0 / ctx.temperature if ctx.temperature > 0.0 and ctx.temperature != 1.0 else 1.0
        transform: LogitTransform = ctx.transform
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # summed over the chunks in fp32, also when the weight is bf16 (FSDP's mixed precision on CUDA)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            weight32 = weight.float()
            for i in range(0, hidden.shape[0], ctx.chunk):
                h, g = hidden[i : i + ctx.chunk], grad_logp[i : i + ctx.chunk].float()
                logits = _logits(h, weight32, ctx.temperature, transform)
                slope = None if transform.identity else transform.slope(logits / scale)  # f'(z), f(z) = logits * T
                grad = logits.sub_(lse_all[i : i + ctx.chunk].unsqueeze(1)).exp_().mul_(-g.unsqueeze(1))  # -softmax*g
                grad[torch.arange(len(h), device=h.device), targets[i : i + ctx.chunk]] += g
                if scale != 1.0:
                    grad.mul_(scale)
                if slope is not None:
                    grad.mul_(slope)
                if grad_hidden is not None:
                    grad_hidden[i : i + ctx.chunk] = grad @ weight32
                if grad_weight is not None:
                    grad_weight.addmm_(grad.T, h.float())
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _logits(hidden: Tensor, weight32: Tensor, temperature: float, transform: LogitTransform) -> Tensor:
    logits = transform(F.linear(hidden.float(), weight32))  # (c, V), fp32: called outside autocast, as head_logits
    if temperature > 0.0 and temperature != 1.0:
        logits = logits / temperature
    return logits


def token_logprobs(
    hidden: Tensor,
    lm_head: nn.Module,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 256,
    with_entropy: bool = False,
    transform: LogitTransform = NO_TRANSFORM,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(transform(lm_head(h)) / temperature)[target], chunk_tokens rows of logits at a time.

    Memory holds one (chunk_tokens, V) block of logits, whatever the number of
    tokens; backward recomputes each block (see ``_LinearLogprob``).
    hidden (M, H), targets (M,) -> logp (M,) and, optionally, the policy's
    entropy per token (M,, detached).
    """
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("token_logprobs supports bias-free output layers only")
    logp, entropy = _LinearLogprob.apply(hidden, lm_head.weight, targets, temperature, chunk_tokens, with_entropy,
                                         transform)
    return logp, entropy if with_entropy else None


def length_buckets(lengths: list[int], overhead_tokens: int = 32) -> list[list[int]]:
    """Split rows into groups of similar length, so that each is padded only to its own longest.

    Minimises the padded tokens run (rows x longest, summed over groups) plus
    overhead_tokens for every extra forward call, exactly, by dynamic
    programming over the rows sorted longest first. Returns row indices,
    longest group first; rows of length 0 are left out.
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    n = len(order)
    best, cut = [0.0] * (n + 1), [n] * (n + 1)  # best[i]: cost of rows order[i:]; cut[i]: end of i's group
    for i in range(n - 1, -1, -1):
        width = lengths[order[i]]  # the longest of any group starting at i
        # on a tie the longer group wins: fewer calls
        best[i], cut[i] = min(((j - i) * width + overhead_tokens + best[j], -j) for j in range(i + 1, n + 1))
        cut[i] = -cut[i]
    groups, i = [], 0
    while i < n:
        groups.append(order[i : cut[i]])
        i = cut[i]
    return groups


@contextmanager
def checkpointed_layers(decoder: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Gradient checkpointing of the training pass, layer by layer: inside, each decoder layer keeps
    only its inputs for backward and runs again there (torch.utils.checkpoint, non-reentrant).

    The layers extend a KV cache as they run (the prompt's keys under the completions). A re-run first
    puts the layer's cache slot back as it was before the first run, so it attends to the same keys and
    extends the same state. transformers' own checkpointing instead turns the cache off inside
    checkpointed layers, which would drop the prompt from the completions' attention.
    """
    layers = list(getattr(decoder, "layers", ())) if enabled else []
    own = [layer.__dict__.get("forward") for layer in layers]
    for index, layer in enumerate(layers):
        layer.forward = _checkpointed(layer.forward, index)
    try:
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


CACHE_ARGS = ("cache", "past_key_values", "past_key_value", "layer_past")  # a layer's cache, by library version


def _checkpointed(forward: object, index: int) -> object:
    """``forward`` of the decoder layer ``index`` under checkpointing, its cache slot restored per run."""

    def run_checkpointed(*args: object, **kwargs: object) -> object:
        cache = next((kwargs[name] for name in CACHE_ARGS if kwargs.get(name) is not None), None)
        slots = None if cache is None else len(cache.layers)  # a cache may add its layers as they run
        before = None if cache is None or index >= slots else dict(vars(cache.layers[index]))

        def run(*a: object, **k: object) -> object:
            if before is not None:
                cache.layers[index].__dict__.update(before)
            elif cache is not None:
                del cache.layers[slots:]
            hidden = a[0] if a else k["hidden_states"]
            with grouped_kv_attention(hidden.device):  # the re-run in backward attends as the first run did
                return forward(*a, **k)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return run_checkpointed


def completion_hidden(
    model: nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: Tensor,
    lengths: Tensor,
    group_size: int,
    pad_id: int,
    *,
    share_prefix: bool = True,
) -> tuple[Tensor, Tensor]:
    """Final hidden states that predict each completion token, for real tokens only.

    Returns hidden (M, H) and each one's flat position row * T + t in the
    (N, T) completion grid, M = lengths.sum(). With share_prefix the B prompts
    are run once and their KV cache repeated over the G completions of each
    group; the completions then run in groups of similar length
    (``length_buckets``), each padded only to its own longest, so padding
    costs little. Without share_prefix each of the N sequences (prompt +
    completion) is run in full: the reference the fast pass is tested against.
    """
    decoder = model.get_decoder()
    device = completion_ids.device
    n, t = completion_ids.shape
    if not share_prefix:
        return full_sequences_hidden(decoder, prompt_ids, completion_ids, lengths, group_size, pad_id)
    embed = TokenEmbeddings(model, torch.cat([
        torch.tensor([pad_id] + [i for p in prompt_ids for i in p], device=device), completion_ids.reshape(-1)]))
    state = encode_prompt_batch(decoder, prompt_ids, group_size, pad_id, embed)
    parts, places = [], []
    for bucket in length_buckets(lengths.tolist()):
        rows = torch.tensor(bucket, device=device)
        width = int(lengths[rows].max())
        hidden = state.last_hidden[rows].unsqueeze(1)  # (r, 1, H): predicts each row's first token
        if width > 1:
            attn = torch.cat([state.attn[rows], state.attn.new_ones((len(rows), width - 1))], dim=1)
            cpos = state.next_pos[rows].unsqueeze(1) + torch.arange(width - 1, device=device)  # (r, w-1)
            rest = decode(
                decoder, select_rows(state.cache, rows),
                inputs_embeds=embed(completion_ids[rows, : width - 1]), attention_mask=attn, position_ids=cpos,
                use_cache=True,
            ).last_hidden_state  # (r, w-1, H)
            hidden = torch.cat([hidden, rest], dim=1)
        valid = torch.arange(width, device=device) < lengths[rows].unsqueeze(1)  # (r, w)
        parts.append(hidden[valid])
        places.append((rows.unsqueeze(1) * t + torch.arange(width, device=device))[valid])
    if not parts:  # no completion has a token
        return state.last_hidden[:0], torch.zeros(0, dtype=torch.long, device=device)
    return torch.cat(parts), torch.cat(places)


def full_sequences_hidden(decoder: nn.Module, prompt_ids: list[list[int]], completion_ids: Tensor, lengths: Tensor,
                          group_size: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """:func:`completion_hidden` without share_prefix: each of the N sequences (prompt + completion) run in
    full, the reference the fast pass is tested against."""
    device = completion_ids.device
    n, t = completion_ids.shape
    rows = [p for p in prompt_ids for _ in range(group_size)]
    ids, attn = left_pad(rows, pad_id, device)  # (N, L)
    width = ids.shape[1]
    ids = torch.cat([ids, completion_ids], dim=1)
    attn = torch.cat([attn, attn.new_ones((n, t))], dim=1)
    hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=positions(attn)).last_hidden_state
    valid = torch.arange(t, device=device) < lengths.unsqueeze(1)  # (N, T)
    flat = torch.arange(n * t, device=device).view(n, t)
    return hidden[:, width - 1 : width - 1 + t][valid], flat[valid]


def rollout_logprobs(
    model: nn.Module,
    rollout: Rollout,
    pad_id: int,
    *,
    temperature: float = 1.0,
    share_prefix: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = 256,
    checkpoint_layers: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Current-policy log-probs (and entropy) of a rollout's sampled tokens, (N, T), 0 after each end.

    Each row runs in full (policy and environment tokens, as the episode
    saw them), but only the policy's tokens go through the output layer:
    environment tokens and padding cost neither logits nor memory, and their
    log-probs are 0. ``checkpoint_layers``: gradient checkpointing, each
    decoder layer run again in backward (``checkpointed_layers``).
    """
    n, t = rollout.completion_ids.shape
    grad = checkpoint_layers and torch.is_grad_enabled()
    with grouped_kv_attention(rollout.completion_ids.device), checkpointed_layers(model.get_decoder(), grad):
        hidden, places = completion_hidden(
            model, rollout.prompt_ids, rollout.completion_ids, rollout.spans, rollout.group_size, pad_id,
            share_prefix=share_prefix,
        )
    if rollout.env_mask is not None:  # environment tokens are context: no logits, no loss, no KL
        policy = rollout.mask.reshape(-1)[places] > 0
        hidden, places = hidden[policy], places[policy]
    logp, ent = token_logprobs(
        hidden, model.get_output_embeddings(), rollout.completion_ids.reshape(-1)[places],
        temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
        transform=logit_transform(model),
    )
    grid = logp.new_zeros(n * t).scatter(0, places, logp).view(n, t)
    if not with_entropy:
        return grid, None
    return grid, ent.new_zeros(n * t).scatter(0, places, ent).view(n, t)
