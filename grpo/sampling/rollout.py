"""Batched sampling: G completions (or episode turns) per prompt, each prompt's KV cache shared by its group.

Every group repeats one prompt G times, so the prompt is run once
(grpo/sampling/forward.py) and its cache repeated G times; sequences that have
stopped leave the decoding batch. A turn's state can be paused and
continued after an environment's tokens (grpo/sampling/episodes.py). The sampled
tokens' log-probs are recorded; the training pass recomputes them with
gradients (grpo/learning/logprobs.py).

Shape legend: B prompts, G samples per prompt, N = B*G, L prompt tokens,
T completion tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.sampling.forward import (
    decode,
    encode_prompt_batch,
    head_logits,
    join_caches,
    left_pad,
    output_head,
    positions,
    select_rows,
)
from grpo.sampling.packed_linear import packed_linears
from grpo.sampling.random_streams import stream_uniforms
from grpo.system.heap_settings import reuse_freed_memory


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
    episodes: list | None = None  # N grpo.sampling.episodes.Episode records (transcripts, counts), or None

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

    def select_groups(self, groups: Tensor, start: int = 0, stop: int | None = None) -> Rollout:
        """The sub-rollout made of the given group indices: whole groups, or each one's rows start:stop
        (then its group_size is stop - start: the rows share their prompt, as a group's do)."""
        stop = self.group_size if stop is None else stop
        rows = group_rows(groups, self.group_size, start, stop)
        width = max(int(self.spans[rows].max().item()) if len(rows) else 0, 1)
        return Rollout(
            prompt_ids=[self.prompt_ids[int(i)] for i in groups],
            completion_ids=self.completion_ids[rows, :width],
            mask=self.mask[rows, :width],
            logprobs=self.logprobs[rows, :width],
            truncated=self.truncated[rows],
            texts=[self.texts[int(i)] for i in rows],
            group_size=stop - start,
            env_mask=None if self.env_mask is None else self.env_mask[rows, :width],
            episodes=None if self.episodes is None else [self.episodes[int(i)] for i in rows],
        )


def group_rows(groups: Tensor, group_size: int, start: int, stop: int) -> Tensor:
    """(len(groups) * (stop - start),) the row indices of rows start:stop of each given group."""
    return (groups.unsqueeze(1) * group_size + torch.arange(start, stop)).reshape(-1)


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
    """Draw one token per row; return it and its log-prob under the distribution it was drawn from.

    That distribution is softmax(logits / temperature) truncated to the
    top-k / top-p set and renormalised: log pi_sampler(a) = z_a / T -
    log sum_{b in kept} exp(z_b / T). With neither option it is the untruncated
    softmax(logits / T), the policy the training pass recomputes. Both engines
    record this one definition (vLLM's ``processed_logprobs``): the TIS weight
    pi_trainer / pi_sampler then divides by the probability the token was
    really drawn with, so it corrects the truncation as well as the engines'
    numerical mismatch (docs/sampler-logprobs.md says why).
    temperature = 0 is greedy decoding (log softmax(logits), as vLLM's). Each row's uniform number comes from
    ``uniforms`` (n,) when given (per-row streams, grpo/sampling/random_streams.py), else
    from ``generator``. (n, V) -> (n,), (n,).
    """
    logits = logits.float()
    if temperature <= 0.0:
        token = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        # z / 1 is z exactly: at the default temperature the division is a pass over (n, V) that changes nothing
        logp = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
        kept = filter_logits(logp, top_k=top_k, top_p=top_p)
        probs = kept.softmax(dim=-1)
        if top_k > 0 or top_p < 1.0:  # the kept tokens' mass renormalised to 1, as the draw uses it
            logp = kept.log_softmax(dim=-1)
        if uniforms is None:
            uniforms = torch.rand(probs.shape[0], generator=generator, device=probs.device)
        token = inverse_cdf(probs, uniforms)
    return token, logp.gather(1, token.unsqueeze(1)).squeeze(1)


def inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sampling: row i's token is the first whose cumulative mass reaches u_i times the row's
    total. probs (n, V), uniforms (n,) in [0, 1) -> (n,).

    One uniform number per row: torch.multinomial draws an exponential per
    vocabulary entry, which cost ~12 ms a step for 16 x 49k on the CPU.
    The target u is kept at least the smallest normal float: the search
    returns the first index with cdf >= u, which for u = 0 would be index 0
    even when masking (top-k, top-p) left it no mass. Any u > 0 is at least
    2^-24 times the total, far above that floor, so no other draw changes.
    """
    cdf = probs.cumsum(dim=-1)  # (n, V)
    u = uniforms.to(cdf.device, cdf.dtype).unsqueeze(1) * cdf[:, -1:]  # (n, 1)
    u = u.clamp(min=torch.finfo(cdf.dtype).tiny)
    return torch.searchsorted(cdf, u).squeeze(1).clamp(max=probs.shape[-1] - 1)


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
    token_budget: int = 0,
) -> Rollout:
    """Sample group_size completions for each prompt, sharing each prompt's KV cache.

    A completion ends at a stop token (by default every end-of-turn id, see
    :func:`end_of_turn_ids`), at
    the token that completes one of ``stop_strings`` (kept in the completion,
    so its log-prob is trained like any other), or at max_new_tokens.
    ``stop_early(tokens so far, rows still decoding)`` may end every row at
    once, as if that were the limit (the pre-flight check's token-limit fit).
    ``streams`` (N, 2), one key per row (grpo/sampling/random_streams.py), gives each row its own
    random numbers, whatever else is in the batch; without it rows draw from ``generator``.
    ``token_budget`` (0: none): the prompts' prefill runs in calls of at most that many tokens.
    A single-turn episode (grpo/sampling/episodes.py) is exactly this.
    """
    decoder, lm_head = model.get_decoder(), output_head(model)
    device = next(model.parameters()).device
    stops = torch.tensor(
        stop_token_ids if stop_token_ids is not None else end_of_turn_ids(model, tokenizer), device=device
    )
    state = start_state(decoder, lm_head, prompt_ids, group_size, tokenizer.pad_token_id, token_budget)
    turn = sample_turn(
        decoder, lm_head, tokenizer, state, max_new_tokens=max_new_tokens, stops=stops,
        temperature=temperature, top_p=top_p, top_k=top_k, stop_strings=stop_strings, generator=generator,
        stop_early=stop_early, streams=streams,
    )
    return _rollout_of(turn, tokenizer, prompt_ids, group_size, device)


def _rollout_of(turn: Turn, tokenizer: object, prompt_ids: list[list[int]], group_size: int, device: torch.device
                ) -> Rollout:
    """:func:`generate`'s Rollout from its one turn: cut to the longest completion, the mask, the texts."""
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

