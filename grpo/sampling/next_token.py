"""One token drawn per row from the decoder's logits, with its log-prob under the distribution it was drawn from.

The logits are divided by the temperature and cut to the top-k / top-p set (:func:`filter_logits`); the token
is drawn by inverse CDF from one uniform number a row (:func:`inverse_cdf`; each row's own stream,
grpo/sampling/random_streams.py, when the decode loop gives one). The log-prob :func:`sample_next` returns is
the sampler's, the one both engines record (docs/sampler-logprobs.md); the decode loop that calls it is
grpo/sampling/decode_loop.py. Shapes: n rows, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
