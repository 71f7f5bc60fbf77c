"""Held-out evaluation: greedy pass@1 under the task's checker."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from grpo.rollout import generate


def encode_prompts(tokenizer: object, messages: Sequence[list[dict]]) -> list[list[int]]:
    """Token ids of chat prompts, rendered by the tokenizer's chat template."""
    out = []
    for msgs in messages:
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        out.append(list(ids["input_ids"] if isinstance(ids, Mapping) else ids))
    return out


@torch.no_grad()
def greedy_accuracy(
    model: nn.Module,
    tokenizer: object,
    prompts: list[list[int]],
    rows: Sequence[Mapping],
    reward: Callable[[str, Mapping], float],
    *,
    max_new_tokens: int,
    batch_size: int = 128,
) -> tuple[float, list[str]]:
    """Fraction of prompts whose greedy completion earns the checker's full reward (1.0)."""
    was_training = model.training
    model.eval()
    texts: list[str] = []
    for i in range(0, len(prompts), batch_size):
        rollout = generate(
            model, tokenizer, prompts[i : i + batch_size], group_size=1,
            max_new_tokens=max_new_tokens, temperature=0.0,
        )
        texts.extend(rollout.texts)
    model.train(was_training)
    if not texts:
        return 0.0, texts
    correct = sum(reward(t, row) >= 1.0 for t, row in zip(texts, rows))
    return correct / len(texts), texts
