"""The own engine's decode loop: one turn sampled token by token for every row of a decoding state.

A turn starts from the prompts run once and repeated for their group (:func:`start_state`), draws each row's
next token (grpo/sampling/next_token.py) and runs it through the decoder, one step a token; a row leaves
the batch at a stop token, at the token that completes a stop string, or at its token budget. In an
episode a finished row's cache is kept aside (``Turn.paused``), gathered again for the rows that go on
(:func:`resume`) and the environment's tokens run onto it (:func:`prefill`), so the conversation is never
encoded again. grpo/sampling/rollout.py's ``generate`` is one such turn.

Shape legend: n rows (N = B*G for a whole batch), L cached tokens, T turn tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.sampling.forward import (
    decode,
    encode_prompt_batch,
    head_logits,
    join_caches,
    left_pad,
    positions,
    select_rows,
)
from grpo.sampling.next_token import sample_next
from grpo.sampling.packed_linear import packed_linears
from grpo.sampling.random_streams import stream_uniforms
from grpo.system.heap_settings import reuse_freed_memory


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
    max_new_tokens. Rows that end leave the decoding batch; with ``keep_paused``
    their cache is kept aside (``Turn.paused``) for the episode to continue (:func:`resume`).
    ``streams`` (n, 2): each row's random stream (grpo/sampling/random_streams.py), drawn at counter
    ``drawn`` (n,) + t for its t-th token (``drawn``: its episode's tokens in earlier turns,
    so no number is used twice); without it rows draw from ``generator``.
    Freed blocks are reused while the turn runs (grpo/system/heap_settings.py): each step frees and allocates the same
    few dozen blocks of a few MB. On an x86 CPU the linear layers run on reordered weights
    (grpo/sampling/packed_linear.py; a step's rounds share one reordering).
    """
    with packed_linears(decoder, lm_head), reuse_freed_memory():  # the copies' blocks not kept in the heap
        return _sample_turn(decoder, lm_head, tokenizer, state, max_new_tokens=max_new_tokens, stops=stops,
                            budget=budget, temperature=temperature, top_p=top_p, top_k=top_k,
                            stop_strings=stop_strings, generator=generator, streams=streams, drawn=drawn,
                            stop_early=stop_early, keep_paused=keep_paused)


def _sample_turn(
    decoder: nn.Module,
    lm_head: nn.Module,
    tokenizer: object,
    state: DecodeState,
    *,
    max_new_tokens: int,
    stops: Tensor,
    budget: Tensor | None,
    temperature: float,
    top_p: float,
    top_k: int,
    stop_strings: tuple[str, ...],
    generator: torch.Generator | None,
    streams: Tensor | None,
    drawn: Tensor | None,
    stop_early: Callable[[int, int], bool] | None,
    keep_paused: bool,
) -> Turn:
    """:func:`sample_turn`'s loop, one decode step a token."""
    device = state.attn.device
    cache, attn, next_pos, logits = state.cache, state.attn, state.next_pos, state.logits
    tokens, logprobs, lengths, stopped = _turn_buffers(attn.shape[0], max_new_tokens, tokenizer.pad_token_id, device)
    paused: list[tuple[Tensor, DecodeState]] = []
    active = torch.arange(attn.shape[0], device=device)  # rows of the full batch still decoding
    for t in range(max_new_tokens):
        uniforms = None if streams is None else stream_uniforms(  # (len(active),)
            streams[active], t if drawn is None else drawn[active] + t)
        token, logp = sample_next(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator, uniforms=uniforms
        )
        tokens[active, t], logprobs[active, t], lengths[active] = token, logp, t + 1
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
            active, token, attn, next_pos = _leave(done, active, token, DecodeState(cache, attn, next_pos, None),
                                                   paused if keep_paused else None)
        cache, attn, logits, next_pos = _decode_step(decoder, lm_head, cache, attn, token, next_pos)
    return Turn(tokens, logprobs, lengths, stopped, paused)


def _decode_step(decoder: nn.Module, lm_head: nn.Module, cache: object, attn: Tensor, token: Tensor,
                 next_pos: Tensor) -> tuple[object, Tensor, Tensor, Tensor]:
    """One decode step of the rows still decoding: their tokens (r,) into the cache; the cache, the attention
    mask one column longer, the next logits (r, V) and positions (r,)."""
    attn = torch.cat([attn, attn.new_ones((len(token), 1))], dim=1)
    out = decode(decoder, cache, input_ids=token.unsqueeze(1), attention_mask=attn,
                 position_ids=next_pos.unsqueeze(1), use_cache=True)
    cache, logits, next_pos = out.cache, head_logits(out.last_hidden_state[:, -1], lm_head), next_pos + 1
    return cache, attn, logits, next_pos


def _turn_buffers(n: int, max_new_tokens: int, pad_id: int, device: torch.device
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A turn's tokens (n, T) (pad after each row's end), their log-probs (n, T), lengths (n,), stopped (n,)."""
    return (torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device),
            torch.zeros((n, max_new_tokens), device=device), torch.zeros(n, dtype=torch.long, device=device),
            torch.zeros(n, dtype=torch.bool, device=device))


def _leave(done: Tensor, active: Tensor, token: Tensor, state: DecodeState,
           paused: list[tuple[Tensor, DecodeState]] | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Take the rows that are ``done`` out of the decoding batch (their cache too, in place); with
    ``paused``, keep their state there. Returns the remaining rows, their last tokens, mask and positions."""
    if paused is not None:
        ended = done.nonzero().squeeze(1)
        paused.append((active[ended], DecodeState(
            select_rows(state.cache, ended), state.attn[ended], state.next_pos[ended], None)))
    keep = (~done).nonzero().squeeze(1)
    state.cache.batch_select_indices(keep)
    return active[keep], token[keep], state.attn[keep], state.next_pos[keep]


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
    decoder: nn.Module, lm_head: nn.Module, state: DecodeState, chunks: list[list[int]], pad_id: int,
    token_budget: int = 0,
) -> DecodeState:
    """Run each row's new tokens (r rows, any lengths >= 1) onto its cache; return where sampling continues.

    The chunks are left-padded to one block, so every row's last column is
    a real token and its hidden state gives the next token's logits.
    ``token_budget`` (0: none): the rows run in calls of at most that many new tokens (rows x W,
    at least one row a call), their caches then joined.
    """
    ids, block = left_pad(chunks, pad_id, state.attn.device)  # (r, W)
    attn = torch.cat([state.attn, block], dim=1)
    pos = state.next_pos.unsqueeze(1) + positions(block)  # (r, W)
    step = len(chunks) if token_budget <= 0 else max(1, token_budget // ids.shape[1])
    caches, hidden = [], []
    for i in range(0, len(chunks), step):
        rows = torch.arange(i, min(i + step, len(chunks)), device=ids.device)
        cache = state.cache if step >= len(chunks) else select_rows(state.cache, rows)
        out = decode(decoder, cache, input_ids=ids[rows], attention_mask=attn[rows], position_ids=pos[rows],
                     use_cache=True)
        caches.append(out.cache)
        hidden.append(out.last_hidden_state[:, -1])
    logits = head_logits(torch.cat(hidden), lm_head)  # (r, V)
    return DecodeState(join_caches(caches), attn, state.next_pos + block.sum(dim=1), logits)


def start_state(decoder: nn.Module, lm_head: nn.Module, prompt_ids: list[list[int]], group_size: int,
                pad_id: int, token_budget: int = 0) -> DecodeState:
    """The B prompts run once (in calls within ``token_budget``), their state repeated for the G rows of each
    group."""
    state = encode_prompt_batch(decoder, prompt_ids, group_size, pad_id, token_budget=token_budget)
    return DecodeState(state.cache, state.attn, state.next_pos, head_logits(state.last_hidden, lm_head))


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

