"""Batched sampling of G completions per prompt, and log-probs of sampled tokens.

Every group repeats one prompt G times, so the prompt is run once: its KV
cache is computed for the B distinct prompts and then repeated G times,
both when sampling and in the training pass (where the gradient flows back
through the shared cache into the prompt's forward pass, summed over the G
completions, so it is exact). Sequences that have stopped are dropped from
the decoding batch.

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
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.streams import stream_uniforms


@dataclass
class Rollout:
    """What one step sampled: B prompts, G episodes each, as N = B*G rows.

    A row is everything after the prompt: the policy's tokens and, in a
    multi-turn episode, the environment's (tool results, feedback) between
    its turns. ``mask`` marks the policy's tokens, the only ones the loss and
    the KL see; ``env_mask`` the environment's, which are context only. A
    single-turn row is all policy tokens (``env_mask`` None).
    """

    prompt_ids: list[list[int]]  # B prompts' token ids
    completion_ids: Tensor  # (N, T) the tokens after the prompt, pad after the end
    mask: Tensor  # (N, T) 1.0 on tokens the policy sampled (each turn's stop token included)
    logprobs: Tensor  # (N, T) log-probs of the sampled tokens at sampling time (0 elsewhere)
    truncated: Tensor  # (N,) bool: a turn ran into its token limit without a stop token
    texts: list[str]  # N decoded completions (in an episode: the last policy turn, what the task scores)
    group_size: int
    env_mask: Tensor | None = None  # (N, T) 1.0 on environment tokens (context, not trained)
    episodes: list | None = None  # N grpo.episodes.Episode records (transcripts, counts), or None

    @property
    def lengths(self) -> Tensor:
        """(N,) policy tokens per row: what the loss normalises by."""
        return self.mask.sum(dim=1).long()

    @property
    def spans(self) -> Tensor:
        """(N,) tokens per row up to its last policy or environment token: what a forward pass runs."""
        used = self.mask if self.env_mask is None else self.mask + self.env_mask  # (N, T)
        last = torch.where(used > 0, torch.arange(1, used.shape[1] + 1, device=used.device), 0)
        return last.max(dim=1).values.long() if used.shape[1] else used.sum(dim=1).long()

    def select_groups(self, groups: Tensor) -> Rollout:
        """The sub-rollout made of the given group indices (whole groups)."""
        g = self.group_size
        rows = (groups.unsqueeze(1) * g + torch.arange(g)).reshape(-1)
        width = max(int(self.spans[rows].max().item()) if len(rows) else 0, 1)
        return Rollout(
            prompt_ids=[self.prompt_ids[int(i)] for i in groups],
            completion_ids=self.completion_ids[rows, :width],
            mask=self.mask[rows, :width],
            logprobs=self.logprobs[rows, :width],
            truncated=self.truncated[rows],
            texts=[self.texts[int(i)] for i in rows],
            group_size=g,
            env_mask=None if self.env_mask is None else self.env_mask[rows, :width],
            episodes=None if self.episodes is None else [self.episodes[int(i)] for i in rows],
        )


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """One rollout of the parts' groups, in order, right-padded to the widest (at least one part)."""
    width = max(r.mask.shape[1] for r in parts)

    def cat(name: str, value: float) -> Tensor:
        return torch.cat([F.pad(getattr(r, name), (0, width - r.mask.shape[1]), value=value) for r in parts])

    multi_turn = any(r.env_mask is not None for r in parts)
    if multi_turn:
        parts = [r if r.env_mask is not None else replace(r, env_mask=torch.zeros_like(r.mask)) for r in parts]
    return Rollout(
        prompt_ids=[p for r in parts for p in r.prompt_ids],
        completion_ids=cat("completion_ids", pad_id),
        mask=cat("mask", 0.0),
        logprobs=cat("logprobs", 0.0),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts],
        group_size=parts[0].group_size,
        env_mask=cat("env_mask", 0.0) if multi_turn else None,
        episodes=[e for r in parts for e in r.episodes] if all(r.episodes is not None for r in parts) else None,
    )


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-pad token lists; return ids (B, L) and attention mask (B, L)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attn[i, width - len(p) :] = 1
    return ids.to(device), attn.to(device)


def _positions(attn: Tensor) -> Tensor:
    return (attn.cumsum(dim=-1) - 1).clamp(min=0)


def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. (n, V)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row; return it and its log-prob under softmax(logits / temperature).

    The log-prob is that of the policy being trained (temperature-scaled, not
    truncated by top-k/top-p), the one the training pass recomputes.
    temperature = 0 is greedy decoding. Each row's uniform number comes from
    ``uniforms`` (n,) when given (per-row streams, grpo/streams.py), else
    from ``generator``. (n, V) -> (n,), (n,).
    """
    logits = logits.float()
    if temperature <= 0.0:
        token = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        logp = torch.log_softmax(logits / temperature, dim=-1)
        probs = filter_logits(logp, top_k=top_k, top_p=top_p).softmax(dim=-1)
        # Inverse-CDF sampling: one uniform number per row. (torch.multinomial draws an
        # exponential per vocabulary entry, which cost ~12 ms a step for 16 x 49k on the CPU.)
        cdf = probs.cumsum(dim=-1)  # (n, V)
        if uniforms is None:
            uniforms = torch.rand(probs.shape[0], generator=generator, device=probs.device)
        u = uniforms.to(cdf.device, cdf.dtype).unsqueeze(1) * cdf[:, -1:]  # (n, 1)
        token = torch.searchsorted(cdf, u).squeeze(1).clamp(max=probs.shape[-1] - 1)
    return token, logp.gather(1, token.unsqueeze(1)).squeeze(1)


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
    decoder: nn.Module, prompts: list[list[int]], repeats: int, pad_id: int, embed: TokenEmbeddings | None = None
) -> PromptState:
    """Run B prompts once and repeat their state for the G sequences of each group.

    Two levels of sharing: the prefix common to the whole batch (typically
    the chat template's system prompt) is computed once for all B prompts,
    then each prompt's own part once for its G samples. Autograd sees the
    repeats as index operations, so gradients through the cache are exact
    (summed over the rows that share it). Layout of a row's keys:
    [shared prefix][left padding][own part]. With ``embed`` the input
    embeddings come from that table instead of the decoder's own lookup.
    """
    device = next(decoder.parameters()).device

    def inputs(ids: Tensor) -> dict[str, Tensor]:
        return {"input_ids": ids} if embed is None else {"inputs_embeds": embed(ids)}

    shared = common_prefix_length(prompts) if len(prompts) > 1 else 0
    if shared >= 8:
        prefix = torch.tensor([prompts[0][:shared]], device=device)  # (1, P)
        cache = decode(decoder, **inputs(prefix), use_cache=True).cache
        cache.batch_repeat_interleave(len(prompts))
        ids, own_attn = left_pad([p[shared:] for p in prompts], pad_id, device)  # (B, S)
        attn = torch.cat([own_attn.new_ones((len(prompts), shared)), own_attn], dim=1)
        pos = (_positions(attn))[:, shared:]
        out = decode(decoder, cache, **inputs(ids), attention_mask=attn, position_ids=pos, use_cache=True)
    else:
        ids, attn = left_pad(prompts, pad_id, device)  # (B, L)
        pos = _positions(attn)
        out = decode(decoder, **inputs(ids), attention_mask=attn, position_ids=pos, use_cache=True)
    cache = out.cache
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)
    return PromptState(
        cache=cache,
        last_hidden=out.last_hidden_state[:, -1].repeat_interleave(repeats, dim=0),
        attn=attn.repeat_interleave(repeats, dim=0),
        next_pos=(pos[:, -1] + 1).repeat_interleave(repeats),
    )


def check_supported(model: nn.Module) -> None:
    """The fast paths compute logits as lm_head(final hidden state); refuse models that rescale them."""
    cfg = getattr(model, "config", None)
    for key in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(cfg, key, None) not in (None, 1.0):
            raise ValueError(f"models with {key} are not supported yet")


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


def end_of_turn_ids(model: nn.Module, tokenizer: object) -> list[int]:
    """Every token id that ends a turn: the tokenizer's EOS and each id of the model's
    ``generation_config.eos_token_id``. Chat models often declare several (Qwen2.5: ``<|im_end|>``
    and ``<|endoftext|>``; Gemma ends turns with ``<end_of_turn>``, Phi-3 with ``<|end|>``), and a
    sampler that stops only on the tokenizer's EOS runs on past the end of the answer."""
    ids = [tokenizer.eos_token_id]
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(declared) if isinstance(declared, (list, tuple)) else [declared]
    return sorted({int(i) for i in ids if i is not None})


@dataclass
class DecodeState:
    """Where sampling continues from, one row per sequence."""

    cache: object  # a transformers Cache of every row's tokens so far
    attn: Tensor  # (n, L) key mask over the cached positions (0: padding, also between turns)
    next_pos: Tensor  # (n,) position id of the next token fed
    logits: Tensor | None  # (n, V) logits of the next token; None for a paused state


@dataclass
class Turn:
    """One turn sampled for n rows, and the states it left them in."""

    tokens: Tensor  # (n, T) sampled tokens, pad after each row's end
    logprobs: Tensor  # (n, T) their log-probs at sampling time, 0 after the end
    lengths: Tensor  # (n,)
    stopped: Tensor  # (n,) bool: ended on a stop token or string (else on the token limit)
    paused: list[tuple[Tensor, DecodeState]]  # (rows, their state) without each row's last token fed


def sample_turn(
    decoder: nn.Module,
    lm_head: nn.Module,
    tokenizer: object,
    state: DecodeState,
    *,
    max_new_tokens: int,
    stops: Tensor,
    budget: Tensor | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_strings: tuple[str, ...] = (),
    generator: torch.Generator | None = None,
    streams: Tensor | None = None,
    drawn: Tensor | None = None,
    stop_early: Callable[[int, int], bool] | None = None,
    keep_paused: bool = False,
) -> Turn:
    """Sample one turn for every row of ``state`` (consumed) until each stops.

    A row ends at a stop token, at the token that completes one of
    ``stop_strings``, at its own ``budget`` of tokens (n,) or at
    max_new_tokens. Rows that end leave the decoding batch; with
    ``keep_paused`` their cache is kept aside (``Turn.paused``) so that an
    episode can continue it (see :func:`resume`).
    ``streams`` (n, 2): each row's random stream (grpo/streams.py), drawn at
    counter ``drawn`` (n,) + t for its t-th token of the turn (``drawn``: the
    tokens its episode sampled in earlier turns, so no number is used twice);
    without it rows draw from ``generator``.
    """
    device = state.attn.device
    pad_id = tokenizer.pad_token_id
    cache, attn, next_pos, logits = state.cache, state.attn, state.next_pos, state.logits
    n = attn.shape[0]
    tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((n, max_new_tokens), device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    paused: list[tuple[Tensor, DecodeState]] = []
    active = torch.arange(n, device=device)  # rows of the full batch still decoding
    for t in range(max_new_tokens):
        uniforms = None
        if streams is not None:  # (len(active),)
            uniforms = stream_uniforms(streams[active], t if drawn is None else drawn[active] + t)
        token, logp = sample_next(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, uniforms=uniforms
        )
        tokens[active, t] = token
        logprobs[active, t] = logp
        lengths[active] = t + 1
        done = torch.isin(token, stops)
        if stop_strings:
            done |= _ends_with_stop(tokenizer, tokens[active, : t + 1], stop_strings)
        stopped[active[done]] = True
        if budget is not None:
            done |= budget[active] <= t + 1
        last = t == max_new_tokens - 1 or bool(done.all())
        if last or (stop_early is not None and stop_early(t + 1, int((~done).sum()))):
            if keep_paused:
                paused.append((active, DecodeState(cache, attn, next_pos, None)))
            break
        if bool(done.any()):
            if keep_paused:
                ended = done.nonzero().squeeze(1)
                paused.append((active[ended], DecodeState(
                    _select_rows(cache, ended), attn[ended], next_pos[ended], None)))
            keep = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            active, token, attn, next_pos = active[keep], token[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, attn.new_ones((len(active), 1))], dim=1)
        out = decode(
            decoder,
            cache,
            input_ids=token.unsqueeze(1),
            attention_mask=attn,
            position_ids=next_pos.unsqueeze(1),
            use_cache=True,
        )
        cache = out.cache
        logits = lm_head(out.last_hidden_state[:, -1])
        next_pos = next_pos + 1
    return Turn(tokens, logprobs, lengths, stopped, paused)


def resume(paused: list[tuple[Tensor, DecodeState]], rows: list[int]) -> DecodeState:
    """One decoding state for the given rows (in that order), gathered from their paused states.

    The parts hold caches of different lengths: each is left-padded with
    masked positions to the longest, so a row's keys are [padding][its
    tokens]; position ids are the rows' own, so the holes change nothing.
    """
    from transformers import DynamicCache

    wanted = {r: i for i, r in enumerate(rows)}
    parts = []  # (indices into the part's rows, order in the result, state)
    for part_rows, st in paused:
        pick = [j for j, r in enumerate(part_rows.tolist()) if r in wanted]
        if pick:
            parts.append((torch.tensor(pick), [wanted[int(part_rows[j])] for j in pick], st))
    width = max(st.attn.shape[1] for _, _, st in parts)
    order = torch.tensor([k for _, ks, _ in parts for k in ks]).argsort()
    attn = torch.cat([F.pad(st.attn[pick], (width - st.attn.shape[1], 0)) for pick, _, st in parts])[order]
    next_pos = torch.cat([st.next_pos[pick] for pick, _, st in parts])[order]
    cache = DynamicCache()
    for layer in range(len(parts[0][2].cache.layers)):
        kv = []
        for name in ("keys", "values"):
            kv.append(torch.cat([
                F.pad(getattr(st.cache.layers[layer], name)[pick.to(attn.device)],
                      (0, 0, width - st.attn.shape[1], 0))
                for pick, _, st in parts])[order])
        cache.update(kv[0], kv[1], layer)
    return DecodeState(cache, attn, next_pos, None)


def prefill(
    decoder: nn.Module, lm_head: nn.Module, state: DecodeState, chunks: list[list[int]], pad_id: int
) -> DecodeState:
    """Run each row's new tokens (r rows, any lengths >= 1) onto its cache; return where sampling continues.

    The chunks are left-padded to one block, so every row's last column is
    a real token and its hidden state gives the next token's logits.
    """
    ids, block = left_pad(chunks, pad_id, state.attn.device)  # (r, W)
    attn = torch.cat([state.attn, block], dim=1)
    pos = state.next_pos.unsqueeze(1) + _positions(block)  # (r, W)
    out = decode(decoder, state.cache, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
    return DecodeState(out.cache, attn, state.next_pos + block.sum(dim=1), lm_head(out.last_hidden_state[:, -1]))


def start_state(decoder: nn.Module, lm_head: nn.Module, prompt_ids: list[list[int]], group_size: int,
                pad_id: int) -> DecodeState:
    """The B prompts run once, their state repeated for the G rows of each group."""
    state = encode_prompt_batch(decoder, prompt_ids, group_size, pad_id)
    return DecodeState(state.cache, state.attn, state.next_pos, lm_head(state.last_hidden))


@torch.no_grad()
def generate(
    model: nn.Module,
    tokenizer: object,
    prompt_ids: list[list[int]],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: list[int] | None = None,
    stop_strings: tuple[str, ...] = (),
    generator: torch.Generator | None = None,
    streams: Tensor | None = None,
    stop_early: Callable[[int, int], bool] | None = None,
) -> Rollout:
    """Sample group_size completions for each prompt, sharing each prompt's KV cache.

    A completion ends at a stop token (by default every end-of-turn id, see
    :func:`end_of_turn_ids`), at
    the token that completes one of ``stop_strings`` (kept in the completion,
    so its log-prob is trained like any other), or at max_new_tokens.
    ``stop_early(tokens so far, rows still decoding)`` may end every row at
    once, as if that were the limit (the pre-flight check's token-limit fit).
    ``streams`` (N, 2), one key per row (grpo/streams.py), gives each row its own
    random numbers, whatever else is in the batch; without it rows draw from ``generator``.
    A single-turn episode (grpo/episodes.py) is exactly this.
    """
    check_supported(model)
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    device = next(model.parameters()).device
    stops = torch.tensor(
        stop_token_ids if stop_token_ids is not None else end_of_turn_ids(model, tokenizer), device=device
    )
    state = start_state(decoder, lm_head, prompt_ids, group_size, tokenizer.pad_token_id)
    turn = sample_turn(
        decoder, lm_head, tokenizer, state, max_new_tokens=max_new_tokens, stops=stops,
        temperature=temperature, top_p=top_p, top_k=top_k, stop_strings=stop_strings, generator=generator,
        stop_early=stop_early, streams=streams,
    )
    width = max(int(turn.lengths.max().item()), 1)
    mask = (torch.arange(width, device=device) < turn.lengths.unsqueeze(1)).float()  # (N, T)
    tokens, logprobs = turn.tokens[:, :width], turn.logprobs[:, :width] * mask
    texts = tokenizer.batch_decode(
        [row[: int(k)].tolist() for row, k in zip(tokens, turn.lengths, strict=False)], skip_special_tokens=True
    )
    return Rollout(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=tokens,
        mask=mask,
        logprobs=logprobs,
        truncated=~turn.stopped,
        texts=texts,
        group_size=group_size,
    )


def _ends_with_stop(tokenizer: object, tokens: Tensor, stop_strings: tuple[str, ...]) -> Tensor:
    """Whether the text of each row's latest tokens contains a stop string that its newest token completed."""
    longest = max(len(x) for x in stop_strings)
    # Every token decodes to at least one character or none, so this many tokens hold any stop string.
    tail = tokens[:, -(longest + 1) :].tolist()
    hits = []
    for row in tail:
        before = tokenizer.decode(row[:-1], skip_special_tokens=True)
        after = tokenizer.decode(row, skip_special_tokens=True)
        hits.append(any(x in after and x not in before for x in stop_strings))
    return torch.tensor(hits, device=tokens.device)


class _LinearLogprob(torch.autograd.Function):
    """log softmax(h W^T / temperature)[target] per row, chunk by chunk, never holding all the logits.

    Forward keeps only h and each row's log-sum-exp; backward recomputes a
    chunk's logits and turns them into their gradient in place,
    (onehot - softmax) * g / temperature, so a chunk costs one (c, V) buffer
    in each direction. The entropy output carries no gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, with_entropy):  # noqa: ANN001, ANN205
        device = hidden.device.type
        # backward recomputes the logits under the same autocast as forward (bf16 on CUDA), so they match
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        m = hidden.shape[0]
        logp, lse_all = hidden.new_empty(m, dtype=torch.float32), hidden.new_empty(m, dtype=torch.float32)
        entropy = hidden.new_zeros(m if with_entropy else 0, dtype=torch.float32)
        for i in range(0, m, chunk):
            logits = _logits(hidden[i : i + chunk], weight, temperature)  # (c, V)
            lse = torch.logsumexp(logits, dim=-1)
            logp[i : i + chunk] = logits.gather(1, targets[i : i + chunk].unsqueeze(1)).squeeze(1) - lse
            lse_all[i : i + chunk] = lse
            if with_entropy:
                weighted = (logits - lse.unsqueeze(1)).exp_().mul_(logits)  # softmax * logits
                entropy[i : i + chunk] = lse - weighted.sum(dim=-1)
        ctx.save_for_backward(hidden, weight, targets, lse_all)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):  # noqa: ANN001, ANN205
        hidden, weight, targets, lse_all = ctx.saved_tensors
        scale = 1.0 / ctx.temperature if ctx.temperature > 0.0 and ctx.temperature != 1.0 else 1.0
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # summed over the chunks in fp32, also when the weight is bf16 (FSDP's mixed precision on CUDA)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        device, dtype, enabled = ctx.autocast
        for i in range(0, hidden.shape[0], ctx.chunk):
            h, g = hidden[i : i + ctx.chunk], grad_logp[i : i + ctx.chunk].float()
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                logits = _logits(h, weight, ctx.temperature)
            grad = logits.sub_(lse_all[i : i + ctx.chunk].unsqueeze(1)).exp_().mul_(-g.unsqueeze(1))  # -softmax*g
            grad[torch.arange(len(h), device=h.device), targets[i : i + ctx.chunk]] += g
            if scale != 1.0:
                grad.mul_(scale)
            grad = grad.to(h.dtype)
            if grad_hidden is not None:
                with torch.autocast(device, dtype=dtype, enabled=enabled):  # the autocast dtype, as forward's
                    grad_hidden[i : i + ctx.chunk] = grad @ weight
            if grad_weight is not None:  # in place, in fp32 (in-place products never autocast)
                grad_weight.addmm_(grad.T.float(), h.float())
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    logits = (hidden @ weight.T).float()  # (c, V)
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
) -> tuple[Tensor, Tensor | None]:
    """log softmax(lm_head(h) / temperature)[target], chunk_tokens rows of logits at a time.

    Memory holds one (chunk_tokens, V) block of logits, whatever the number of
    tokens; backward recomputes each block (see ``_LinearLogprob``).
    hidden (M, H), targets (M,) -> logp (M,) and, optionally, the policy's
    entropy per token (M,, detached).
    """
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("token_logprobs supports bias-free output layers only")
    logp, entropy = _LinearLogprob.apply(hidden, lm_head.weight, targets, temperature, chunk_tokens, with_entropy)
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


def _select_rows(cache: object, rows: Tensor) -> object:
    """A cache holding the given rows of ``cache``, which is left as it is (autograd flows through)."""
    sub = copy.copy(cache)
    sub.layers = [copy.copy(layer) for layer in cache.layers]
    sub.batch_select_indices(rows)
    return sub


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
        rows = [p for p in prompt_ids for _ in range(group_size)]
        ids, attn = left_pad(rows, pad_id, device)  # (N, L)
        width = ids.shape[1]
        ids = torch.cat([ids, completion_ids], dim=1)
        attn = torch.cat([attn, attn.new_ones((n, t))], dim=1)
        hidden = decoder(input_ids=ids, attention_mask=attn, position_ids=_positions(attn)).last_hidden_state
        valid = torch.arange(t, device=device) < lengths.unsqueeze(1)  # (N, T)
        flat = torch.arange(n * t, device=device).view(n, t)
        return hidden[:, width - 1 : width - 1 + t][valid], flat[valid]
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
                decoder, _select_rows(state.cache, rows),
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


def rollout_logprobs(
    model: nn.Module,
    rollout: Rollout,
    pad_id: int,
    *,
    temperature: float = 1.0,
    share_prefix: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = 256,
) -> tuple[Tensor, Tensor | None]:
    """Current-policy log-probs (and entropy) of a rollout's sampled tokens, (N, T), 0 after each end.

    Each row runs in full (policy and environment tokens, as the episode
    saw them), but only the policy's tokens go through the output layer:
    environment tokens and padding cost neither logits nor memory, and their
    log-probs are 0.
    """
    n, t = rollout.completion_ids.shape
    with grouped_kv_attention(rollout.completion_ids.device):
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
    )
    grid = logp.new_zeros(n * t).scatter(0, places, logp).view(n, t)
    if not with_entropy:
        return grid, None
    return grid, ent.new_zeros(n * t).scatter(0, places, ent).view(n, t)
