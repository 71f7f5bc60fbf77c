"""The teacher's model and its passes over the student's rollout.

The sampled form needs the teacher's log-probs of the sampled tokens only: one pass over the batch without
grad before the update, micro-batch by micro-batch within micro_batch_tokens, as the reference's log-probs
are computed (grpo/learning/update.py ``teacher_scores``). The full form needs the teacher's logits at every position
beside the student's, so it runs inside each micro-step: both models' final hidden states, then the
divergence a chunk of positions at a time (grpo/learning/teacher/divergence.py ``chunked_jsd``).

Shape legend: N sequences, T completion tokens, M scored tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from grpo.config import TrainConfig
from grpo.learning.logprobs import checkpointed_layers, completion_hidden, token_logprobs
from grpo.learning.teacher.divergence import (
    Logits,
    chunked_jsd,
    sampled_reverse_kl,
    teacher_metrics,
    teacher_token_stats,
)
from grpo.learning.teacher.options import check_vocabulary
from grpo.math.loss import aggregate_loss
from grpo.sampling.forward import grouped_kv_attention, logit_transform
from grpo.sampling.rollout import Rollout


@dataclass(frozen=True)
class TeacherScores:
    """What the teacher says of each sampled token."""

    logp: Tensor  # (N, T) log q(y_t) at the sampling temperature, 0 past each end
    disagree: Tensor  # (N, T) 1.0 where the teacher's most likely token is not the one sampled

    def rows(self, rows: Tensor, width: int) -> TeacherScores:
        """The scores of the rollout's ``rows``, cut to ``width`` tokens (a micro-batch's)."""
        return TeacherScores(self.logp[rows, :width], self.disagree[rows, :width])


def load_teacher(config: TrainConfig, model: nn.Module, reference: nn.Module | None, tokenizer: object,
                 device: torch.device) -> nn.Module | None:
    """The frozen teacher, in eval mode; None without --teacher. A teacher named as the model is the policy's
    starting weights: the reference's module when the KL term has one, else a copy of the policy made before
    any update, never loaded again. Another teacher's tokenizer is compared with the model's first."""
    if not config.teacher:
        return None
    if config.teacher == config.model:
        teacher = reference if reference is not None else copy.deepcopy(model)
    else:
        from grpo.models import load_policy

        check_vocabulary(config.teacher, tokenizer.get_vocab())
        teacher = load_policy(config.teacher, device=device).model
    teacher.eval().requires_grad_(False)
    return teacher


def head_logits(model: nn.Module, temperature: float, vocab: int | None = None) -> Logits:
    """hidden (c, H) -> the model's logits (c, V) in fp32, its logit transform applied, over the temperature;
    only the first ``vocab`` rows of its output embedding (the tokenizer's tokens), when given: a model
    family's members pad their tables to different sizes (Qwen2.5-7B 152064 rows, 0.5B 151936), and the
    rows beyond the tokenizer are no token of either model, so never counted."""
    weight, transform = model.get_output_embeddings().weight[:vocab], logit_transform(model)

    def logits(hidden: Tensor) -> Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            z = transform(F.linear(hidden.float(), weight.float()))
        return z / temperature if temperature > 0.0 and temperature != 1.0 else z

    return logits


def rollout_hidden(model: nn.Module, rollout: Rollout, pad_id: int, *, share_prefix: bool = True,
                   checkpoint_layers: bool = False) -> tuple[Tensor, Tensor]:
    """The final hidden states (M, H) that predict the rollout's policy tokens, and each one's flat place
    row * T + t in the (N, T) grid (grpo/learning/logprobs.py ``rollout_logprobs``'s first half)."""
    grad = checkpoint_layers and torch.is_grad_enabled()
    with grouped_kv_attention(rollout.completion_ids.device), checkpointed_layers(model.get_decoder(), grad):
        hidden, places = completion_hidden(model, rollout.prompt_ids, rollout.completion_ids, rollout.spans,
                                           rollout.group_size, pad_id, share_prefix=share_prefix)
    if rollout.env_mask is not None:  # environment tokens are context: not the policy's, not scored
        policy = rollout.mask.reshape(-1)[places] > 0
        hidden, places = hidden[policy], places[policy]
    return hidden, places


def _grid(values: Tensor, places: Tensor, shape: torch.Size) -> Tensor:
    return values.new_zeros(shape.numel()).scatter(0, places, values).view(shape)


@torch.no_grad()
def teacher_pass(teacher: nn.Module, rollout: Rollout, pad_id: int, *, temperature: float,
                 vocab: int | None = None) -> TeacherScores:
    """The teacher's scores of one micro-batch's sampled tokens, over the first ``vocab`` tokens."""
    hidden, places = rollout_hidden(teacher, rollout, pad_id)
    targets = rollout.completion_ids.reshape(-1)[places]
    logq, top = teacher_token_stats(hidden, targets, head_logits(teacher, temperature, vocab))
    shape = rollout.completion_ids.shape
    return TeacherScores(_grid(logq, places, shape), _grid((top != targets).float(), places, shape))


def micro_batched_scores(teacher: nn.Module, rollout: Rollout, parts: list, pad_id: int, *,
                         temperature: float, vocab: int | None = None) -> TeacherScores:
    """The teacher's scores of the whole rollout, (N, T) each, one :func:`teacher_pass` per micro-batch of
    ``parts`` (grpo/learning/update.py ``Micro``s covering every row once)."""
    logp = torch.zeros(rollout.completion_ids.shape, device=rollout.completion_ids.device)  # (N, T)
    disagree = torch.zeros_like(logp)
    for micro in parts:
        scores = teacher_pass(teacher, micro.select(rollout), pad_id, temperature=temperature, vocab=vocab)
        rows, width = micro.rows(rollout.group_size).to(logp.device), scores.logp.shape[1]
        logp[rows, :width], disagree[rows, :width] = scores.logp, scores.disagree
    return TeacherScores(logp, disagree)


def full_form_pass(model: nn.Module, rollout: Rollout, teacher: nn.Module, pad_id: int, *, temperature: float,
                   beta: float, share_prefix: bool = True, checkpoint_layers: bool = False,
                   vocab: int | None = None) -> tuple[Tensor, Tensor, Tensor, TeacherScores]:
    """The student's log-probs and entropy of one micro-batch (N, T), with grad, the generalised JSD to the
    teacher at each position (N, T), with grad through the student's side, over the first ``vocab`` tokens
    of both (the tokenizer's), and the teacher's scores."""
    hidden, places = rollout_hidden(model, rollout, pad_id, share_prefix=share_prefix,
                                    checkpoint_layers=checkpoint_layers)
    targets = rollout.completion_ids.reshape(-1)[places]
    logp, entropy = token_logprobs(hidden, model.get_output_embeddings(), targets, temperature=temperature,
                                   with_entropy=True, transform=logit_transform(model))
    with torch.no_grad():
        t_hidden, t_places = rollout_hidden(teacher, rollout, pad_id)
        where = torch.empty(rollout.completion_ids.numel(), dtype=torch.long, device=places.device)
        where[t_places] = torch.arange(len(t_places), device=places.device)
        t_hidden = t_hidden[where[places]]  # (M, H) in the student's order of places
    teacher_logits = head_logits(teacher, temperature, vocab)
    jsd = chunked_jsd(hidden, t_hidden, head_logits(model, temperature, vocab), teacher_logits, beta=beta)
    logq, top = teacher_token_stats(t_hidden, targets, teacher_logits)
    shape = rollout.completion_ids.shape
    scores = TeacherScores(_grid(logq, places, shape), _grid((top != targets).float(), places, shape))
    return _grid(logp, places, shape), _grid(entropy, places, shape), _grid(jsd, places, shape), scores


def teacher_loss(config: TrainConfig, logp: Tensor, scores: TeacherScores, jsd: Tensor | None, mask: Tensor, *,
                 total_tokens: float, total_sequences: float) -> tuple[Tensor, dict[str, Tensor]]:
    """teacher_coef x the teacher term (per token: the sampled form's estimate, or the full form's ``jsd``),
    aggregated as the surrogate is (--aggregate, the whole minibatch's normalisers), and its metrics: in the
    full form ``teacher_kl`` is the exact divergence it optimises (the generalised JSD at teacher_beta, the
    reverse KL at 1), not the sampled tokens' estimate, and the divergence_rising alarm reads that."""
    mask = mask.to(logp.dtype)
    per_token = jsd * mask if jsd is not None else sampled_reverse_kl(logp, scores.logp, mask)  # (N, T)
    loss = aggregate_loss(per_token, mask, mode=config.aggregate, max_tokens=config.max_new_tokens,
                          total_tokens=total_tokens, total_sequences=total_sequences)
    metrics = teacher_metrics(logp.detach(), scores.logp, scores.disagree, mask)
    if jsd is not None:
        metrics["teacher_kl"] = (jsd.detach().float() * mask).sum() / mask.sum().clamp(min=1.0)
    return config.teacher_coef * loss, metrics
