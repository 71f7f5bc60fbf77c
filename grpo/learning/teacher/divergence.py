"""The teacher term's math, pure functions of tensors (torch alone).

Legend: N sequences, T completion tokens, M scored tokens, H hidden size, V vocabulary. p is the student
(the policy, softmax(logits / temperature)), q the teacher at the same temperature.

Two forms of the per-token term, each a function of the sampled prefix y_<t (the prefix is the student's
own sample and is not differentiated: the state distribution's dependence on theta is left out, as in GKD):

- sampled: the reverse KL's one-sample estimate at the sampled token y_t, d_t = log p(y_t) - log q(y_t)
  (k1). Its gradient as written would be grad log p(y_t), whose mean under p is zero: useless. The
  estimator of grad KL(p || q) is the score function d_t * grad log p(y_t) (REINFORCE with the per-token
  reward -d_t and no credit to earlier tokens, Thinking Machines' discount 0), so d_t is detached.
- full: the generalised JSD over the whole vocabulary at each position, TRL's GKD convention:
  JSD_beta(p, q) = beta KL(q || m) + (1 - beta) KL(p || m), m = beta q + (1 - beta) p; its endpoints are
  taken as the KLs themselves (the JSD vanishes there): beta = 1 is the reverse KL(p || q), beta = 0 the
  forward KL(q || p). The gradient is exact (no sampling in the vocabulary); q is detached.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def sampled_reverse_kl(logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """(N, T) the sampled form's per-token term: value d_t = log p(y_t) - log q(y_t), gradient
    d_t * grad log p(y_t) (d_t detached), 0 where ``mask`` (N, T) is 0 (padding, errored rows, environment
    tokens). logp carries the gradient; teacher_logp (N, T) none."""
    mask = mask.to(logp.dtype)
    d = (logp - teacher_logp).detach() * mask  # (N, T)
    return d + d * (logp - logp.detach())  # value d, gradient d * grad logp


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float) -> Tensor:
    """(M,) JSD_beta(p, q) per row of logits (M, V) (p = softmax(student_logits), q = softmax(teacher_logits),
    both already divided by the temperature): beta = 1 the reverse KL(p || q), beta = 0 the forward
    KL(q || p), else beta KL(q || m) + (1 - beta) KL(p || m), m = beta q + (1 - beta) p (TRL's GKD)."""
    s = F.log_softmax(student_logits.float(), dim=-1)
    t = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    if beta == 1.0:
        return (s.exp() * (s - t)).sum(dim=-1)
    if beta == 0.0:
        return (t.exp() * (t - s)).sum(dim=-1)
    m = torch.logsumexp(torch.stack([s + math.log(1.0 - beta), t + math.log(beta)]), dim=0)  # log m, (M, V)
    return beta * (t.exp() * (t - m)).sum(dim=-1) + (1.0 - beta) * (s.exp() * (s - m)).sum(dim=-1)


Logits = Callable[[Tensor], Tensor]  # hidden (c, H) -> logits (c, V), divided by the temperature


def chunked_jsd(student_hidden: Tensor, teacher_hidden: Tensor, student_logits: Logits, teacher_logits: Logits,
                *, beta: float, chunk_tokens: int = 256) -> Tensor:
    """(M,) :func:`generalized_jsd` of each scored position, from the student's and the teacher's final hidden
    states (M, H), ``chunk_tokens`` rows at a time: each chunk is checkpointed, so forward keeps no (c, V)
    block and backward recomputes one chunk's logits at a time; the vocabulary's logits for all M tokens are
    never held at once."""

    def one(h_s: Tensor, h_t: Tensor) -> Tensor:
        return generalized_jsd(student_logits(h_s), teacher_logits(h_t), beta)

    parts = [checkpoint(one, student_hidden[i : i + chunk_tokens], teacher_hidden[i : i + chunk_tokens].detach(),
                        use_reentrant=False)
             for i in range(0, student_hidden.shape[0], chunk_tokens)]
    return torch.cat(parts) if parts else student_hidden.new_zeros(0, dtype=torch.float32)


@torch.no_grad()
def teacher_token_stats(teacher_hidden: Tensor, targets: Tensor, teacher_logits: Logits, *,
                        chunk_tokens: int = 256) -> tuple[Tensor, Tensor]:
    """The teacher's log q(y_t) (M,) of the sampled tokens ``targets`` (M,) and its most likely token (M,),
    from its hidden states (M, H), a chunk of logits at a time. A target beyond the teacher's logits (a
    student's padding row, past the tokenizer) is no token of the teacher's: scored at its least likely."""
    logq, top = [], []
    for i in range(0, teacher_hidden.shape[0], chunk_tokens):
        logits = teacher_logits(teacher_hidden[i : i + chunk_tokens]).float()  # (c, V)
        lse, y = torch.logsumexp(logits, dim=-1), targets[i : i + chunk_tokens]
        picked = logits.gather(1, y.clamp(max=logits.shape[1] - 1).unsqueeze(1)).squeeze(1)
        logq.append(torch.where(y < logits.shape[1], picked, logits.min(dim=-1).values) - lse)
        top.append(logits.argmax(dim=-1))
    if not logq:
        return teacher_hidden.new_zeros(0, dtype=torch.float32), targets[:0]
    return torch.cat(logq), torch.cat(top)


@torch.no_grad()
def teacher_metrics(logp: Tensor, teacher_logp: Tensor, disagree: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The micro-batch's token means over ``mask`` (N, T): ``teacher_kl``, the reverse KL's estimate
    mean(log p - log q) at the sampled tokens, and ``teacher_disagree_frac``, the share of tokens whose
    teacher's most likely token is not the one sampled (``disagree`` (N, T), 1 or 0)."""
    mask = mask.float()
    n = mask.sum().clamp(min=1.0)
    return {"teacher_kl": ((logp.float() - teacher_logp) * mask).sum() / n,
            "teacher_disagree_frac": (disagree.float() * mask).sum() / n}
