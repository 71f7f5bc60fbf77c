"""Batched sampling: G completions (or episode turns) per prompt, each prompt's KV cache shared by its group.

Every group repeats one prompt G times, so the prompt is run once
(grpo/sampling/forward.py) and its cache repeated G times; sequences that have
stopped leave the decoding batch. A turn's state can be paused and
continued after an environment's tokens (grpo/sampling/episodes.py). The sampled
tokens' log-probs are recorded; the training pass recomputes them with
gradients (grpo/learning/logprobs.py). Here: the :class:`Rollout` record and :func:`generate`; the
decode loop it runs is grpo/sampling/decode_loop.py, each token's draw grpo/sampling/next_token.py.

Shape legend: B prompts, G samples per prompt, N = B*G, L prompt tokens,
T completion tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.sampling.decode_loop import Turn, sample_turn, start_state
from grpo.sampling.forward import output_head


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


def end_of_turn_ids(model: nn.Module, tokenizer: object) -> list[int]:
    """Every token id that ends a turn: the tokenizer's EOS and each id of the model's
    ``generation_config.eos_token_id``. Chat models often declare several (Qwen2.5: ``<|im_end|>``
    and ``<|endoftext|>``; Gemma ends turns with ``<end_of_turn>``, Phi-3 with ``<|end|>``), and a
    sampler that stops only on the tokenizer's EOS runs on past the end of the answer."""
    ids = [tokenizer.eos_token_id]
    declared = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(declared) if isinstance(declared, (list, tuple)) else [declared]
    return sorted({int(i) for i in ids if i is not None})


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
