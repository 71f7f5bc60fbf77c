"""Who samples an episode's turns: the policy itself, continuing each episode's KV cache, or a vLLM
engine, given the conversation so far. grpo/sampling/episodes.py runs the episodes on either."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpo.sampling.decode_loop import Turn, prefill, resume, sample_turn, start_state
from grpo.sampling.forward import output_head


class OwnTurns:
    """Turns sampled on the policy itself. With ``keep_cache`` each episode's KV cache is paused after a
    turn and continued with the environment's tokens; without, the conversation is encoded again. Every
    prefill runs in calls of at most ``token_budget`` tokens (0: none)."""

    def __init__(self, model: nn.Module, tokenizer: object, prompts: list[list[int]], group_size: int,
                 stops: list[int], *, keep_cache: bool, token_budget: int = 0) -> None:
        self.decoder, self.lm_head = model.get_decoder(), output_head(model)
        self.tokenizer, self.keep_cache, self.token_budget = tokenizer, keep_cache, token_budget
        self.device = next(model.parameters()).device
        self.stops = torch.tensor(stops, device=self.device)
        self.state = start_state(self.decoder, self.lm_head, prompts, group_size, tokenizer.pad_token_id,
                                 token_budget)
        self.turn: Turn | None = None

    def sample(self, budgets: list[int], drawn: list[int], streams: Tensor | None,
               **sampling: object) -> list[tuple[list[int], list[float], bool]]:
        """Each live episode's turn: its tokens, their log-probs, and whether it ended on a stop."""
        self.turn = sample_turn(
            self.decoder, self.lm_head, self.tokenizer, self.state, max_new_tokens=max(budgets), stops=self.stops,
            budget=torch.tensor(budgets, device=self.device), streams=streams,
            drawn=torch.tensor(drawn, device=self.device), keep_paused=self.keep_cache, **sampling)
        t = self.turn
        return [(t.tokens[j, :n].tolist(), t.logprobs[j, :n].tolist(), bool(t.stopped[j]))
                for j, n in enumerate(t.lengths.tolist())]

    def extend(self, going: list[int], replies: list[list[int]], conversations: list[list[int]]) -> None:
        """Go on with the turn's rows ``going`` after their environment's tokens ``replies``."""
        pad_id = self.tokenizer.pad_token_id
        if not self.keep_cache:
            self.state = start_state(self.decoder, self.lm_head, conversations, 1, pad_id, self.token_budget)
            return
        ends = [int(self.turn.tokens[j, int(self.turn.lengths[j]) - 1]) for j in going]
        chunks = [[end, *ids] for end, ids in zip(ends, replies, strict=True)]  # a turn's last token was never run
        self.state = prefill(self.decoder, self.lm_head, resume(self.turn.paused, going), chunks, pad_id,
                             self.token_budget)


class EngineTurns:
    """Turns sampled by a vLLM engine: each turn's requests are the whole conversations so far; the
    engine's prefix cache still holds the keys and values of what it saw before, so the new tokens
    are what it computes."""

    def __init__(self, engine: object, prompts: list[list[int]], group_size: int) -> None:
        self.engine = engine
        self.conversations = [list(prompts[i // group_size]) for i in range(len(prompts) * group_size)]

    def sample(self, budgets: list[int], drawn: list[int], streams: Tensor | None,
               **sampling: object) -> list[tuple[list[int], list[float], bool]]:
        return self.engine.sample(self.conversations, max_tokens=budgets, drawn=drawn, streams=streams, **sampling)

    def extend(self, going: list[int], replies: list[list[int]], conversations: list[list[int]]) -> None:
        self.conversations = conversations
