"""The objective menu, the advantage estimators and the masked mismatch corrections on small tensors.

Expected values are worked out by hand in the comments; each objective's
gradient is checked against autograd: torch.autograd.gradcheck (float64) where
the loss is differentiable as written, and the hand-derived gradient
-sg(w_t) A / |tokens| where the objective's weight is a stop-gradient (CISPO,
DPPO), which finite differences would not see.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo.config import ConfigError, TrainConfig
from grpo.math.algorithm import group_advantages, group_varies, tis_weights
from grpo.math.loss import policy_loss

ln = math.log


def loss_and_grad(logp: list, old: list, adv: list, mask: list | None = None, **kw):
    logp_t = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    mask_t = torch.ones_like(logp_t) if mask is None else torch.tensor(mask, dtype=torch.float64)
    loss, m = policy_loss(logp_t, torch.tensor(old, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64),
                          mask_t, **kw)
    loss.backward()
    return loss.item(), logp_t.grad, m


def close(got, expected, tol=1e-6):
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def test_cispo_clips_a_stop_gradient_weight_and_keeps_every_token_s_gradient():
    # ratios [1.5, 0.5, 1]; clip to [0.8, 1.28] -> weights [1.28, 0.8, 1]; A = 2
    # per-token -w A log pi = [-1.28*2*ln1.5, -0.8*2*ln0.5, 0] = [-1.0379907, 1.1090355, 0]; token mean 0.0236816
    loss, grad, m = loss_and_grad([[ln(1.5), ln(0.5), 0.0]], [[0.0, 0.0, 0.0]], [2.0], objective="cispo",
                                  clip_low=0.2, clip_high=0.28)
    close(loss, 0.0236816)
    close(grad, [[-1.28 * 2 / 3, -0.8 * 2 / 3, -2 / 3]])  # PPO's clip would give the first two no gradient
    close(m["clip_frac_high"], 2 / 3)  # both clipped tokens have A > 0
    close(m["clip_frac_low"], 0.0)


def test_sapo_soft_gate_per_sign_of_the_advantage():
    # row 1, A = +1, tau_pos = 1: ratios [1, 2]; gate f = sigmoid(r - 1) * 4 = [2, 4*0.7310586 = 2.9242344]
    # row 2, A = -1, tau_neg = 1.05: ratio 1; f = 0.5 * 4 / 1.05 = 1.9047619 per token, loss +1.9047619
    # sequence aggregation (SAPO's own): ((-2 - 2.9242344) / 2 + 1.9047619) / 2 = -0.2786777
    loss, grad, m = loss_and_grad([[0.0, ln(2.0)], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [1.0, -1.0],
                                  objective="sapo", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    close(loss, -0.2786777)
    # df/dlog pi = 4 sigmoid'(tau (r - 1)) r (tau cancels): row 1 [1, 4*0.7310586*0.2689414*2 = 1.5728954];
    # row 2 [1, 1]; times -A / (2 tokens * 2 rows)
    close(grad, [[-0.25, -1.5728954 / 4], [0.25, 0.25]])
    assert m["clip_frac_low"] == 0 and m["clip_frac_high"] == 0  # a soft gate clips nothing


def test_gmpo_clips_in_log_space_on_the_side_the_advantage_limits():
    # row 1, A = +1, log rho [0.1, 0.5, -0.3] with (-0.4, 0.4): upper clip only -> [0.1, 0.4, -0.3];
    #   geometric ratio exp(0.2 / 3) = 1.0689391, loss -1.0689391; the clipped token gets no gradient
    # row 2, A = -1, log rho [-0.6, 0.0] (third token padding): lower clip only -> [-0.4, 0];
    #   ratio exp(-0.2) = 0.8187308, loss +0.8187308
    # sequence aggregation (GMPO's own): (-1.0689391 + 0.8187308) / 2 = -0.1251042
    loss, grad, m = loss_and_grad([[0.1, 0.5, -0.3], [-0.6, 0.0, 5.0]], [[0.0] * 3, [0.0] * 3], [1.0, -1.0],
                                  [[1, 1, 1], [1, 1, 0]], objective="gmpo", clip_low=0.4, clip_high=0.4)
    close(loss, -0.1251042)
    # d/dlog pi_t = -A * ratio / |o_i| on unclipped tokens, halved by the two rows
    close(grad, [[-1.0689391 / 6, 0.0, -1.0689391 / 6], [0.0, 0.8187308 / 4, 0.0]])
    close(m["clip_frac_high"], 1 / 5)  # one clipped token of five in the mask, with A > 0
    close(m["clip_frac_low"], 1 / 5)


def test_dppo_tv_drops_tokens_whose_probability_moved_past_the_threshold():
    # pi_old [0.5, 0.5, 0.9] -> pi [0.6, 0.8, 0.5], A = +1, delta 0.15: moved [0.1, 0.3, -0.4] -> inside [T, F, T]
    # weights min(rho, C) = [1.2, -, 0.5555556]; loss -A w log pi = [0.6129907, 0, 0.3850818], mean 0.3326908
    old, new = [[ln(0.5), ln(0.5), ln(0.9)]], [[ln(0.6), ln(0.8), ln(0.5)]]
    loss, grad, m = loss_and_grad(new, old, [1.0], objective="dppo_tv", clip_low=0.15, clip_high=0.15)
    close(loss, 0.3326908)
    close(grad, [[-1.2 / 3, 0.0, -(0.5 / 0.9) / 3]])
    close(m["clip_frac_high"], 1 / 3)
    # ratio_cap C = 1.1 truncates the first weight: -1.1 ln 0.6 = 0.5619081; (0.5619081 + 0.3850818) / 3
    loss, grad, _ = loss_and_grad(new, old, [1.0], objective="dppo_tv", clip_low=0.15, clip_high=0.15, ratio_cap=1.1)
    close(loss, 0.3156633)
    close(grad[0, 0], -1.1 / 3)
    # A = -1: pi_old 0.5 -> pi [0.3, 0.45], moved [-0.2, -0.05]: only the second stays (>= -0.15);
    # loss -(-1) * 0.9 * ln 0.45 = -0.7186569, over 2 tokens
    loss, grad, m = loss_and_grad([[ln(0.3), ln(0.45)]], [[ln(0.5), ln(0.5)]], [-1.0], objective="dppo_tv",
                                  clip_low=0.15, clip_high=0.15)
    close(loss, -0.7186569 / 2)
    close(grad, [[0.0, 0.9 / 2]])
    close(m["clip_frac_low"], 1 / 2)


def test_dppo_kl_drops_tokens_past_the_binary_kl_threshold_in_the_advantage_s_direction():
    # pi_old 0.5 -> 0.8: KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231436 > 0.05 and rising with A > 0: out
    # 0.5 -> 0.52: KL = 0.5 ln(0.5/0.52) + 0.5 ln(0.5/0.48) = 0.0008007 <= 0.05: in
    # 0.9 -> 0.5: falling while A > 0 pushes up: in whatever the KL
    # loss [0, -1.04 ln 0.52, -0.5555556 ln 0.5] = [0, 0.6800836, 0.3850818], mean 0.3550551
    loss, grad, m = loss_and_grad([[ln(0.8), ln(0.52), ln(0.5)]], [[ln(0.5), ln(0.5), ln(0.9)]], [1.0],
                                  objective="dppo_kl", clip_low=0.05, clip_high=0.05)
    close(loss, 0.3550551)
    close(grad, [[0.0, -1.04 / 3, -(0.5 / 0.9) / 3]])
    close(m["clip_frac_high"], 1 / 3)


def random_batch(seed: int, n: int = 6, t: int = 5):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 2 - 0.05  # log-probs in (-2.05, -0.05)
    logp = (old + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3).clamp(max=-0.01)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) > 0.25).to(torch.float64)
    mask[:, 0] = 1.0
    return logp, old, adv, mask


@pytest.mark.parametrize("objective, kw", [
    ("ppo", dict(clip_low=0.2, clip_high=0.28)), ("ppo", dict(ratio_level="sequence", aggregate="sequence")),
    ("sapo", {}), ("gmpo", dict(clip_low=0.4, clip_high=0.4)),
])
def test_differentiable_objectives_pass_gradcheck(objective, kw):
    logp, old, adv, mask = random_batch(1)
    f = lambda lp: policy_loss(lp, old, adv, mask, objective=objective, **kw)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (logp.clone().requires_grad_(),), eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("objective, kw", [
    ("cispo", dict(clip_low=0.2, clip_high=0.28)), ("cispo", dict(clip_low=1.0, clip_high=4.0)),
    ("dppo_tv", dict(clip_low=0.15, clip_high=0.15, ratio_cap=1.3)), ("dppo_kl", dict(clip_low=0.05, clip_high=0.05)),
])
def test_stop_gradient_objectives_match_their_hand_derived_gradient(objective, kw):
    # L = sum_t -sg(w_t) A_i log pi_t * in_t / |tokens|: dL/dlog pi_t = -w_t A_i in_t / |tokens| on the mask
    logp, old, adv, mask = random_batch(2)
    lp = logp.clone().requires_grad_()
    loss, _ = policy_loss(lp, old, adv, mask, objective=objective, aggregate="token", **kw)
    loss.backward()
    ratio = torch.exp(logp - old)
    if objective == "cispo":
        weight = ratio.clamp(1 - kw["clip_low"], 1 + kw["clip_high"])
    else:
        moved, a = logp.exp() - old.exp(), adv.unsqueeze(1)
        if objective == "dppo_tv":
            inside = torch.where(a > 0, moved <= kw["clip_high"], moved >= -kw["clip_low"])
        else:
            p, q = logp.exp(), old.exp()
            kl = q * (old - logp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
            inside = torch.where(a > 0, (kl <= kw["clip_high"]) | (p <= q), (kl <= kw["clip_low"]) | (p >= q))
        assert 0 < int(inside.sum()) < inside.numel()  # the batch exercises the mask
        weight = ratio.clamp(max=kw.get("ratio_cap", 20.0)) * inside
    expected = -weight * adv.unsqueeze(1) * mask / mask.sum()
    torch.testing.assert_close(lp.grad, expected, atol=1e-12, rtol=1e-10)


def test_an_objective_other_than_ppo_refuses_a_sequence_ratio_and_an_unknown_name_is_named():
    logp, old, adv, mask = random_batch(3)
    with pytest.raises(ValueError, match="ratio_level 'sequence' is PPO's"):
        policy_loss(logp, old, adv, mask, objective="cispo", ratio_level="sequence")
    with pytest.raises(ValueError, match="objective must be one of ppo, cispo, sapo, gmpo, dppo_tv, dppo_kl"):
        policy_loss(logp, old, adv, mask, objective="vespo")


def test_rloo_is_the_leave_one_out_baseline():
    # group [1, 0, 0, 1]: 1 - mean(0, 0, 1) = 2/3, 0 - mean(1, 0, 1) = -2/3; group [2, 2, 2, 2]: 0
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    close(group_advantages(r, 4, estimator="rloo"), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0])
    # an errored fourth row leaves the group: [1, 0, 1] -> 1 - mean(0, 1) = 0.5, 0 - mean(1, 1) = -1
    valid = torch.tensor([True, True, True, False])
    close(group_advantages(torch.tensor([1.0, 0.0, 1.0, float("nan")]), 4, estimator="rloo", valid=valid),
          [0.5, -1.0, 0.5, 0.0])


def test_passk_rewards_only_the_best_member_by_its_margin():
    # group [0, 1, 0.5, 1]: the two best tie, margin 0 -> nothing; group [0, 0, 1, 0]: margin 1 at index 2,
    # divided by the group's std 0.5 (eps = 0) -> 2; scale none -> 1
    r = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 0.0, 1.0, 0.0])
    close(group_advantages(r, 4, estimator="passk", eps=0.0), [0, 0, 0, 0, 0, 0, 2.0, 0])
    close(group_advantages(r, 4, estimator="passk", scale="none"), [0, 0, 0, 0, 0, 0, 1.0, 0])
    # the first group varies, but teaches nothing under pass@k
    assert group_varies(r.view(2, 4)).tolist() == [True, True]
    assert group_varies(r.view(2, 4), estimator="passk").tolist() == [False, True]


def test_reinforce_pp_whitens_over_the_batch_s_tokens():
    # rewards [1, 0 | 1, 1] with [1, 3 | 2, 2] tokens: token mean 5/8 = 0.625, token var 0.625 * 0.375 * 8/7
    # = 0.2678571, std 0.5175492: A = [0.375, -0.625, 0.375, 0.375] / 0.5175492
    r, lengths = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1, 3, 2, 2])
    mask = (torch.arange(3) < lengths.unsqueeze(1)).float()  # (4, 3)
    close(group_advantages(r, 2, estimator="reinforce_pp", mask=mask), [0.7245688, -1.2076147, 0.7245688, 0.7245688])
    # the all-equal group [1, 1] gets a non-zero advantage: it teaches, against the batch
    assert group_varies(r.view(2, 2), estimator="reinforce_pp").tolist() == [True, True]
    assert group_varies(torch.ones(2, 2), estimator="reinforce_pp").tolist() == [False, False]  # batch constant
    with pytest.raises(ValueError, match="whitens over the batch.s tokens: pass mask"):
        group_advantages(r, 2, estimator="reinforce_pp")


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens():
    # centred [0.5, -0.5 | 0, 0]; token mean (0.5 - 1.5) / 8 = -0.125; deviations [0.625, -0.375, 0.125, 0.125]
    # token var (0.390625 + 3 * 0.140625 + 4 * 0.015625) / 8 * 8/7 = 0.125, std 0.3535534
    r, lengths = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([1, 3, 2, 2])
    close(group_advantages(r, 2, estimator="reinforce_pp_baseline", mask=lengths),
          [1.7677670, -1.0606602, 0.3535534, 0.3535534])
    assert group_varies(r.view(2, 2), estimator="reinforce_pp_baseline").tolist() == [True, False]


def test_icepop_token_mask_keeps_the_ratio_inside_its_bounds_and_zeroes_the_rest():
    # ratios [[0.4, 1.0], [3.0, 2.0]] in [0.5, 5]: weights [[0, 1], [3, 2]]; 1 of 4 tokens, 1 of 2 completions masked
    trainer = torch.log(torch.tensor([[0.4, 1.0], [3.0, 2.0]]))
    w, m = tis_weights(trainer, torch.zeros(2, 2), torch.ones(2, 2), cap=5.0, level="token", mode="mask", low=0.5)
    close(w, [[0.0, 1.0], [3.0, 2.0]])
    close(m["tis_masked_tokens"], 0.25)
    close(m["tis_masked_sequences"], 0.5)


def test_geometric_sequence_mask_with_skyrl_s_bounds():
    # log ratios [0.01, -0.01]: geometric mean 1, kept (weight 1); [0.03, 0.01]: e^0.02 = 1.0202 > 1.01, masked
    trainer = torch.tensor([[0.01, -0.01], [0.03, 0.01]])
    w, m = tis_weights(trainer, torch.zeros(2, 2), torch.ones(2, 2), cap=1.01, level="sequence", mode="mask", low=0.99)
    close(w, [[1.0, 1.0], [0.0, 0.0]])
    close(m["tis_masked_sequences"], 0.5)


def test_sequence_ratio_mask_and_truncation_on_the_product_ratio():
    # products 2 * 1.2 = 2.4 (inside a cap of 3: kept on every token) and 2 * 2 = 4 (masked, or truncated to 3)
    trainer = torch.log(torch.tensor([[2.0, 1.2], [2.0, 2.0]]))
    w, m = tis_weights(trainer, torch.zeros(2, 2), torch.ones(2, 2), cap=3.0, level="sequence_ratio", mode="mask")
    close(w, [[2.4, 2.4], [0.0, 0.0]])
    close(m["tis_masked_tokens"], 0.5)
    w, m = tis_weights(trainer, torch.zeros(2, 2), torch.ones(2, 2), cap=3.0, level="sequence_ratio")
    close(w, [[2.4, 2.4], [3.0, 3.0]])
    close(m["tis_masked_tokens"], 0.0)


def test_each_objective_takes_its_recommended_settings_when_the_user_sets_none():
    from grpo.config_resolution import settle_config
    from grpo.tasks import get_task

    task = get_task("add")
    ppo = settle_config(TrainConfig(), task)
    assert (ppo.clip_low, ppo.clip_high, ppo.aggregate) == (0.2, 0.28, "token")
    gmpo = settle_config(TrainConfig(objective="gmpo"), task)
    assert (gmpo.clip_low, gmpo.clip_high, gmpo.aggregate) == (0.4, 0.4, "sequence")
    cispo = settle_config(TrainConfig(objective="cispo", clip_high=2.0), task)
    assert (cispo.clip_low, cispo.clip_high) == (1.0, 2.0)  # the user's value stands
    dppo = settle_config(TrainConfig(objective="dppo_tv", clip_low=0.2), task)  # given, equal to ppo's default
    assert (dppo.clip_low, dppo.clip_high) == (0.2, 0.15)


@pytest.mark.parametrize("kw, message", [
    (dict(objective="cispo", ratio_level="sequence"), "ratio_level sequence is ppo's (GSPO)"),
    (dict(tis_low=0.5), "tis_low is the lower bound of tis_mode mask"),
    (dict(tis_mode="mask", tis_low=3.0), "tis_low must lie in [0, tis_cap)"),
    (dict(objective="cispo", clip_low=1.5), "clip_low must be at most 1 for cispo"),
    (dict(objective="ppo_clip"), "objective must be one of ppo, cispo, sapo, gmpo, dppo_tv, dppo_kl"),
])
def test_bad_objective_settings_are_one_line_errors(kw, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kw)
    assert message in str(err.value) and "\n" not in str(err.value)
