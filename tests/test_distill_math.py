"""The teacher term's math (grpo/learning/teacher/divergence.py), by hand: values and gradients, with masked tokens,
errored rows and zero-length completions. p is the student, q the teacher."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.config import TrainConfig
from grpo.learning.teacher.divergence import (
    chunked_jsd,
    generalized_jsd,
    sampled_reverse_kl,
    teacher_metrics,
    teacher_token_stats,
)
from grpo.learning.teacher.scoring import TeacherScores, teacher_loss

LN2 = math.log(2.0)


def test_the_sampled_form_is_the_reverse_kls_estimate_with_a_score_function_gradient():
    # row 0: p(y) = 1/2, 1/4 and q(y) = 1/4, 1/4: d = [ln 2, 0]; row 1 errored (mask 0): nothing
    logp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.9), math.log(0.1)]], requires_grad=True)
    logq = torch.tensor([[math.log(0.25), math.log(0.25)], [math.log(0.1), math.log(0.9)]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    term = sampled_reverse_kl(logp, logq, mask)
    assert torch.allclose(term, torch.tensor([[LN2, 0.0], [0.0, 0.0]]))
    term.sum().backward()
    # d/d logp of d + d (logp - sg(logp)) is d: ln 2 for the first token, 0 for the others
    assert torch.allclose(logp.grad, torch.tensor([[LN2, 0.0], [0.0, 0.0]]))
    assert logq.grad is None or not logq.grad.any()  # the teacher is detached


def test_a_masked_token_adds_neither_value_nor_gradient_and_an_empty_completion_nothing():
    logp = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
    logq = torch.tensor([[math.log(0.25), math.log(0.125)]])
    term = sampled_reverse_kl(logp, logq, torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(term, torch.tensor([[LN2, 0.0]]))
    term.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[LN2, 0.0]]))
    empty = torch.zeros(2, 0, requires_grad=True)  # zero-length completions: T = 0
    out = sampled_reverse_kl(empty, torch.zeros(2, 0), torch.zeros(2, 0))
    assert out.shape == (2, 0) and float(out.detach().sum()) == 0.0


# p = (1/2, 1/2) from logits (0, 0); q = (3/4, 1/4) from logits (ln 3, 0)
STUDENT, TEACHER = [0.0, 0.0], [math.log(3.0), 0.0]
REVERSE = 0.5 * math.log(4 / 3)  # KL(p || q) = 1/2 ln(2/3) + 1/2 ln 2
FORWARD = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL(q || p)
# beta 1/2: m = (5/8, 3/8); KL(q || m) = 3/4 ln 1.2 + 1/4 ln(2/3), KL(p || m) = 1/2 ln 0.8 + 1/2 ln(4/3)
HALF = 0.5 * (0.75 * math.log(1.2) + 0.25 * math.log(2 / 3)) + 0.5 * (0.5 * math.log(0.8) + 0.5 * math.log(4 / 3))


@pytest.mark.parametrize(("beta", "value"), [(1.0, REVERSE), (0.0, FORWARD), (0.5, HALF)],
                         ids=["reverse", "forward", "symmetric"])
def test_the_generalised_jsd_by_hand(beta, value):
    out = generalized_jsd(torch.tensor([STUDENT]), torch.tensor([TEACHER]), beta)
    assert out.shape == (1,) and math.isclose(float(out), value, rel_tol=1e-5)
    assert math.isclose(HALF, 0.033822, abs_tol=1e-6)  # the hand value itself


def test_the_generalised_jsd_is_its_definition_at_an_uneven_beta():
    """beta KL(q || m) + (1 - beta) KL(p || m), m = beta q + (1 - beta) p, written out in probabilities."""
    p, q, beta = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.6, 0.3]), 0.25
    m = beta * q + (1 - beta) * p
    want = beta * (q * (q / m).log()).sum() + (1 - beta) * (p * (p / m).log()).sum()
    got = generalized_jsd(p.log().unsqueeze(0), q.log().unsqueeze(0), beta)
    assert math.isclose(float(got), float(want), rel_tol=1e-5)


def test_the_full_forms_gradients_by_hand():
    # reverse KL: d/dz_k KL(p || q) = p_k (ln p_k - ln q_k - KL) = 1/2 (ln(2/3) - KL, ln 2 - KL)
    z = torch.tensor([STUDENT], requires_grad=True)
    teacher = torch.tensor([TEACHER], requires_grad=True)
    generalized_jsd(z, teacher, 1.0).sum().backward()
    expected = 0.5 * (math.log(2 / 3) - REVERSE)
    assert torch.allclose(z.grad, torch.tensor([[expected, -expected]]), atol=1e-6)
    assert teacher.grad is None or not teacher.grad.any()  # the teacher is detached
    # forward KL: d/dz KL(q || p) = p - q = (-1/4, 1/4)
    z = torch.tensor([STUDENT], requires_grad=True)
    generalized_jsd(z, torch.tensor([TEACHER]), 0.0).sum().backward()
    assert torch.allclose(z.grad, torch.tensor([[-0.25, 0.25]]), atol=1e-6)


def test_equal_distributions_have_zero_divergence_at_every_beta():
    logits = torch.randn(3, 7)
    for beta in (0.0, 0.3, 1.0):
        assert torch.allclose(generalized_jsd(logits, logits.clone(), beta), torch.zeros(3), atol=1e-6)


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
def test_the_chunked_divergence_is_the_whole_ones_in_value_and_gradient(beta):
    torch.manual_seed(0)
    hs, ht = torch.randn(5, 4, requires_grad=True), torch.randn(5, 4)
    ws, wt = torch.randn(9, 4, requires_grad=True), torch.randn(9, 4)
    whole = generalized_jsd(hs @ ws.T / 0.7, ht @ wt.T / 0.7, beta)
    grads = torch.autograd.grad(whole.sum(), (hs, ws))
    chunked = chunked_jsd(hs, ht, lambda h: h @ ws.T / 0.7, lambda h: h @ wt.T / 0.7, beta=beta, chunk_tokens=2)
    assert torch.allclose(chunked, whole, atol=1e-6)
    for got, want in zip(torch.autograd.grad(chunked.sum(), (hs, ws)), grads, strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    empty = chunked_jsd(hs[:0], ht[:0], lambda h: h @ ws.T, lambda h: h @ wt.T, beta=beta)
    assert empty.shape == (0,)


def test_the_teachers_token_stats_and_metrics():
    hidden = torch.tensor([[0.0, math.log(3.0)], [2.0, 0.0], [0.0, 0.0]])  # logits = hidden (V = 2)
    logq, top = teacher_token_stats(hidden, torch.tensor([1, 1, 0]), lambda h: h, chunk_tokens=2)
    assert torch.allclose(logq, torch.tensor([math.log(0.75), -math.log(1 + math.e ** 2), math.log(0.5)]))
    assert top[:2].tolist() == [1, 0]
    m = teacher_metrics(torch.tensor([[math.log(0.5), 0.0]]), torch.tensor([[math.log(0.25), -5.0]]),
                        torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 0.0]]))  # the second token masked
    assert math.isclose(float(m["teacher_kl"]), LN2, rel_tol=1e-6) and float(m["teacher_disagree_frac"]) == 1.0


@pytest.mark.parametrize("aggregate", ["token", "sequence"])
def test_the_teacher_loss_is_its_coefficient_times_the_aggregated_term(aggregate):
    # row 0: d = (ln 2, 0); row 1: d = (2 ln 2, masked); row 2 errored
    logp = torch.tensor([[math.log(0.5)] * 2, [math.log(0.5)] * 2, [0.0, 0.0]], requires_grad=True)
    logq = torch.tensor([[math.log(0.25), math.log(0.5)], [math.log(0.125), 0.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    config = TrainConfig(teacher="t", teacher_coef=2.0, aggregate=aggregate)
    scores = TeacherScores(logq, torch.zeros_like(logq))
    loss, m = teacher_loss(config, logp, scores, None, mask, total_tokens=3.0, total_sequences=2.0)
    # token: (ln 2 + 0 + 2 ln 2) / 3 = ln 2; sequence: ((ln 2 + 0) / 2 + 2 ln 2 / 1) / 2 = 1.25 ln 2
    want = 2.0 * (LN2 if aggregate == "token" else 1.25 * LN2)
    assert math.isclose(float(loss), want, rel_tol=1e-6)
    assert math.isclose(float(m["teacher_kl"]), LN2, rel_tol=1e-6)
    loss.backward()
    per_token = torch.tensor([[LN2, 0.0], [2 * LN2, 0.0], [0.0, 0.0]])
    weight = 1 / 3 if aggregate == "token" else torch.tensor([[0.25, 0.25], [0.5, 0.0], [0.0, 0.0]])
    assert torch.allclose(logp.grad, 2.0 * per_token * weight, atol=1e-6)
    full = torch.tensor([[0.5, 0.5], [1.0, 9.0], [9.0, 9.0]], requires_grad=True)  # the full form's per-token jsd
    loss, _ = teacher_loss(config, logp.detach(), scores, full, mask, total_tokens=3.0, total_sequences=2.0)
    assert math.isclose(float(loss), 2.0 * (2 / 3 if aggregate == "token" else (0.5 + 1.0) / 2), rel_tol=1e-6)


def test_the_divergence_alarm_warns_on_a_rise_only():
    from grpo.learning.teacher.alarm import divergence_rising
    from grpo.observe.alarm_monitor import AlarmMonitor
    from grpo.observe.alarms import AlarmConfig

    rising = [0.2 + 0.02 * i for i in range(6)]  # 0.2 -> 0.3: +50% of its start
    assert "divergence rising: teacher_kl 0.200 -> 0.300" in divergence_rising(rising, 6)
    assert divergence_rising(rising[::-1], 6) is None  # falling: the student learning
    assert divergence_rising([0.2, 0.21, 0.2, 0.22, 0.21, 0.22], 6) is None  # +10%: noise
    assert divergence_rising(rising[:5], 6) is None and divergence_rising([], 6) is None  # too few; no teacher
    assert divergence_rising([0.001 * i for i in range(6)], 6) is None  # under the 0.01 nats floor
    monitor = AlarmMonitor(10, AlarmConfig(window=6))
    flags = [monitor.observe(step, {"teacher_kl": kl})[0] for step, kl in enumerate(rising, 1)]
    assert [f["alarm/divergence_rising"] for f in flags] == [0.0] * 5 + [1.0]
    assert monitor.stopping() is None  # a warning, not a verdict that ends the run
