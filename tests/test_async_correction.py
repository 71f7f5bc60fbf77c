"""Asynchronous GRPO's off-policy correction, checked exactly on a toy policy small enough to enumerate.

A batch is sampled by pi_s, the policy of K updates ago, and the loss is taken at the current pi.
Over such batches the expected gradient of the loss must be the on-policy one,
g* = grad_theta sum_o pi(o) A(o) = sum_o pi(o) A(o) grad log pi(o). When A depends on the
whole completion only the completion's importance ratio prod_t pi/pi_s (tis_level
"sequence_ratio") gives it: a token's weight corrects that token's draw, not its prefix's nor
its continuation's, which pi_s drew too.

The toy: V = 3 tokens, completions of exactly T = 2 tokens, so the 9 completions can be listed;
theta holds the logits of the first token (V,) and of the second given the first (V, V).
The advantage is A(o) = r(o) - b with a constant b, so an expectation is a plain sum over the 9.
"""

import pytest
import torch

from grpo.math.algorithm import tis_weights
from grpo.math.loss import policy_loss

pytestmark = pytest.mark.unit

V, T = 3, 2
CAP = 10.0  # above every completion's pi / pi_s in the toy (asserted), so truncation never enters
COMPLETIONS = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # (9, T) every (o_1, o_2)
# r = 1 for equal tokens and for the pair (1, 2): not a sum of a term per token, so the second
# token's credit depends on the first
REWARD = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)  # (V, V)
BASELINE = 0.5


def toy_thetas() -> tuple[torch.Tensor, torch.Tensor]:
    """The current theta and the sampler's theta_s, an older one: theta minus a random step, (V + V*V,)."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(V + V * V, generator=gen, dtype=torch.float64)
    theta_s = theta - 0.5 * torch.randn(V + V * V, generator=gen, dtype=torch.float64)
    return theta, theta_s


def token_logp(theta: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(o_t | h_t) of each token of the completions ``tokens`` (N, T), (N, T)."""
    first = theta[:V].log_softmax(-1)  # (V,)
    second = theta[V:].view(V, V).log_softmax(-1)  # (V, V), row o_1
    return torch.stack([first[tokens[:, 0]], second[tokens[:, 0], tokens[:, 1]]], dim=1)


def completion_probs(theta: torch.Tensor) -> torch.Tensor:
    """pi(o) of the 9 completions, (9,)."""
    return token_logp(theta, COMPLETIONS).sum(dim=1).exp()


def advantage(tokens: torch.Tensor) -> torch.Tensor:
    """A(o) = r(o) - b, (N,)."""
    return REWARD[tokens[:, 0], tokens[:, 1]] - BASELINE


def on_policy_gradient(theta: torch.Tensor) -> torch.Tensor:
    """g* = grad sum_o pi(o) A(o), by autograd through the exact expectation (no log-derivative trick)."""
    theta = theta.clone().requires_grad_(True)
    (completion_probs(theta) * advantage(COMPLETIONS)).sum().backward()
    return theta.grad


def loss_gradient(theta: torch.Tensor, theta_s: torch.Tensor, tokens: torch.Tensor, level: str | None
                  ) -> torch.Tensor:
    """Gradient of policy_loss at theta on the batch ``tokens`` (N, T) drawn by theta_s, as grpo/learning/update.py's
    old_policy sets it up with TIS: old_logp is the current log-probs detached, the weights carry pi_s.
    ``level=None`` is no correction: the batch taken as on-policy."""
    theta = theta.clone().requires_grad_(True)
    logp = token_logp(theta, tokens)  # (N, T)
    mask = torch.ones_like(logp)
    weight = None
    if level is not None:
        weight, _ = tis_weights(logp.detach(), token_logp(theta_s, tokens), mask, cap=CAP, level=level)
    loss, _ = policy_loss(logp, logp.detach(), advantage(tokens), mask, tis_weight=weight)
    loss.backward()
    return theta.grad


def expected_loss_gradient(theta: torch.Tensor, theta_s: torch.Tensor, level: str | None) -> torch.Tensor:
    """E over batches drawn from pi_s of the loss's gradient, exactly: sum_o pi_s(o) * (gradient on {o})."""
    probs_s = completion_probs(theta_s)  # (9,)
    return sum(probs_s[i] * loss_gradient(theta, theta_s, COMPLETIONS[i : i + 1], level) for i in range(9))


def relative_error(level: str | None) -> float:
    """|E[gradient] - target| / |target|. The loss is minimised and averaged over the T tokens of a
    completion, so the gradient that matches g* is -g* / T."""
    theta, theta_s = toy_thetas()
    target = -on_policy_gradient(theta) / T
    return float((expected_loss_gradient(theta, theta_s, level) - target).norm() / target.norm())


def test_toy_ratios_stay_below_the_cap():
    # the sequence_ratio estimator is unbiased only short of truncation; the toy keeps every ratio under it
    theta, theta_s = toy_thetas()
    ratios = completion_probs(theta) / completion_probs(theta_s)  # (9,)
    assert float(ratios.max()) < CAP


def test_sequence_ratio_gives_the_on_policy_gradient_exactly():
    error = relative_error("sequence_ratio")
    print(f"relative error of the expected gradient, sequence_ratio: {error:.2e}")
    assert error < 1e-10


def test_without_correction_the_expected_gradient_is_biased():
    error = relative_error(None)
    print(f"relative error of the expected gradient, no correction: {error:.3f}")
    assert error > 0.10


def test_token_weights_correct_only_part_of_the_bias():
    # the token ratios fix each token's own draw, not the prefix (or continuation) that A depends on
    token, sequence, none = relative_error("token"), relative_error("sequence_ratio"), relative_error(None)
    print(f"relative error of the expected gradient, token: {token:.3f}")
    assert sequence < 1e-10 < 0.05 < token < none


def monte_carlo_z(level: str | None, n: int = 20000) -> torch.Tensor:
    """(mean gradient over n completions drawn from pi_s - the exact target) / its standard error, per
    coordinate of theta, (V + V*V,)."""
    theta, theta_s = toy_thetas()
    draws = torch.multinomial(completion_probs(theta_s), n, replacement=True,
                              generator=torch.Generator().manual_seed(1))  # (n,) indices into COMPLETIONS
    mean = loss_gradient(theta, theta_s, COMPLETIONS[draws], level)  # the loss on the whole batch
    # each draw's own gradient is that of its completion alone; the spread of these gives the standard error
    table = torch.stack([loss_gradient(theta, theta_s, COMPLETIONS[i : i + 1], level) for i in range(9)])  # (9, P)
    per_draw = table[draws]  # (n, P)
    torch.testing.assert_close(mean, per_draw.mean(dim=0))  # token aggregation over equal lengths: the mean
    stderr = per_draw.std(dim=0) / n**0.5  # (P,)
    return (mean + on_policy_gradient(theta) / T) / stderr


def test_monte_carlo_corrected_gradient_is_within_sampling_error():
    z = monte_carlo_z("sequence_ratio")
    print(f"Monte Carlo z, sequence_ratio: max |z| = {z.abs().max():.2f}")
    assert z.abs().max() < 4.0


def test_monte_carlo_uncorrected_gradient_is_off_beyond_sampling_error():
    z = monte_carlo_z(None)
    print(f"Monte Carlo z, no correction: max |z| = {z.abs().max():.1f}")
    assert z.abs().max() > 6.0


def test_sequence_ratio_weights_by_hand():
    # row 0: deltas [0.2, -0.5, 0.1], sum -0.2 -> w = exp(-0.2) = 0.818731 on its 3 tokens;
    # row 1: deltas [0.5, 0.4] and padding (delta 3, left out), sum 0.9 -> exp(0.9) = 2.4596 > C = 2
    #   -> w = 2 on its 2 valid tokens, 0 on the padding; 2 of the 5 valid tokens are in a capped completion
    trainer = torch.tensor([[-1.0, -2.5, -0.9], [-0.5, -0.6, 3.0]])
    sampler = torch.tensor([[-1.2, -2.0, -1.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, m = tis_weights(trainer, sampler, mask, cap=2.0, level="sequence_ratio")
    torch.testing.assert_close(w, torch.tensor([[0.818731, 0.818731, 0.818731], [2.0, 2.0, 0.0]]))
    assert m["tis_capped_frac"].item() == pytest.approx(2 / 5)
    # a ratio past float range (exp(1000) = inf) is capped, not NaN
    w, _ = tis_weights(torch.tensor([[1000.0]]), torch.zeros(1, 1), torch.ones(1, 1), cap=2.0, level="sequence_ratio")
    torch.testing.assert_close(w, torch.tensor([[2.0]]))


def test_unknown_tis_level_names_the_three():
    with pytest.raises(ValueError, match="must be 'token', 'sequence' or 'sequence_ratio', got 'batch'"):
        tis_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=2.0, level="batch")
