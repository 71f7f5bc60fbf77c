"""What the pre-flight check (grpo/run/preflight.py) samples: a group for each chosen training prompt, scored
as a training round would be, and what it keeps of each completion (its text, length, cut, correctness, where it
reached the gold answer) and of each round (rewards, the rows that did not error, the scorer's metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grpo.run.token_limit import stop_at_fitted_limit
from grpo.sampling.evaluate import check_all
from grpo.sampling.rounds import row_errors, sample_and_score
from grpo.sampling.step_parts import Sampling


@dataclass
class _Samples:
    """What the check sampled, over its rounds: one entry per completion."""

    texts: list[str] = field(default_factory=list)
    last: object = None  # the last round's Rollout, for timing an update
    lengths: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    reach: list[int | None] = field(default_factory=list)  # tokens to the end of the gold answer, if it appears
    answer_lengths: list[int] = field(default_factory=list)  # the gold answers' tokens, one per prompt
    rewards: list[torch.Tensor] = field(default_factory=list)  # (B_round * G,) per round
    valid: list[torch.Tensor] = field(default_factory=list)  # (B_round * G,) per round: the rows that did not error
    metrics: list[dict[str, float]] = field(default_factory=list)  # the scorer's, per round

    def grouped(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rewards (B, G) and which of them are verdicts (B, G): training's errored rows are not."""
        return torch.cat(self.rewards).view(-1, g), torch.cat(self.valid).view(-1, g)


def answer_reach(tokenizer: object, text: str, answer: str) -> int | None:
    """Tokens of ``text`` up to the end of the first occurrence of the gold ``answer`` (None if absent)."""
    at = text.find(answer.strip()) if answer.strip() else -1
    if at < 0:
        return None
    return len(tokenizer.encode(text[: at + len(answer.strip())], add_special_tokens=False))


def _sample_round(
    sampling: Sampling, chosen: Sequence[int], generator: torch.Generator, out: _Samples, *, fit: bool
) -> None:
    """Sample a group for each chosen training prompt and score it, as a training round would."""
    cfg, g = sampling.config, sampling.config.group_size
    stop_early = stop_at_fitted_limit(len(chosen) * g, cfg.max_new_tokens) if fit else None
    rollout, rewards, metrics, _ = sample_and_score(sampling, chosen, generator, stop_early)
    out.last = rollout
    group_rows = [sampling.task.train[i] for i in chosen for _ in range(g)]
    lengths, truncated = rollout.lengths.tolist(), rollout.truncated.tolist()
    checked = [{**r, "truncated": cut} for r, cut in zip(group_rows, truncated, strict=True)]
    out.correct += [s >= 1.0 for s in check_all(sampling.scoring.checker, rollout.texts, checked)]
    tokenizer = sampling.generation.tokenizer
    out.reach += [answer_reach(tokenizer, t, str(r.get("answer") or "")) for t, r in
                  zip(rollout.texts, group_rows, strict=True)]
    out.answer_lengths += [len(tokenizer.encode(str(sampling.task.train[i].get("answer") or ""),
                                                add_special_tokens=False)) for i in chosen]
    out.texts += rollout.texts
    out.lengths += lengths
    out.truncated += truncated
    out.rewards.append(rewards.nan_to_num(0.0))  # a failed call scores 0 here, as in evaluation
    out.valid.append(row_errors(rewards, rollout, mask_truncated=cfg.mask_truncated) == 0)  # as training leaves out
    out.metrics.append(metrics)
