"""Hand-computed cases for the GRPO math (values worked out in the comments)."""

import math

import pytest
import torch

from grpo.math.algorithm import group_advantages, k3_kl, tis_weights
from grpo.math.loss import aggregate_loss, policy_loss


def test_group_advantages_standardises_within_each_group():
    # group 1: r = [1, 0, 0, 1], mean 0.5, unbiased std sqrt(1/3) = 0.57735
    #   -> A = +-0.5 / 0.57735 = +-0.866025
    # group 2: r = [2, 2, 2, 2], std 0 -> A = 0 (no signal)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = group_advantages(r, 4)  # eps = 1e-6 keeps 0 / 0 out of group 2
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0])
    torch.testing.assert_close(a, expected, atol=1e-5, rtol=0)


def test_group_advantages_scales():
    r = torch.tensor([3.0, 1.0, 0.0, 0.0])  # groups [3, 1] and [0, 0]
    # none (Dr. GRPO): centred only -> [1, -1, 0, 0]
    torch.testing.assert_close(group_advantages(r, 2, scale="none"), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # batch: centred / std of all four rewards; std([3,1,0,0]) = sqrt(((2)^2+0^2+1^2+1^2)/3) = sqrt(2)
    got = group_advantages(r, 2, scale="batch", eps=0.0)
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 0.0, 0.0]) / math.sqrt(2.0))


def test_equal_rewards_give_zero_advantage_under_every_scale():
    r = torch.full((6,), 0.7)
    for scale in ("group", "batch", "none"):
        assert torch.count_nonzero(group_advantages(r, 3, scale=scale)) == 0


def test_errored_rows_leave_their_groups_statistics():
    # group 1: r = [1, 0, 9, 1] with the 9 errored -> over [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3)
    #   -> A = [1/3, -2/3, 0, 1/3] / 0.57735 = [0.57735, -1.154701, 0, 0.57735]
    # group 2: r = [1, 0, 0, 0] with three errored -> one valid row, nothing to compare: all 0
    # (without the errored rows left out, group 1 would read mean 2.75 and give the 9 the largest advantage)
    r = torch.tensor([1.0, 0.0, 9.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    valid = torch.tensor([True, True, False, True, True, False, False, False])
    a = group_advantages(r, 4, valid=valid)
    torch.testing.assert_close(a, torch.tensor([0.57735, -1.154701, 0, 0.57735, 0, 0, 0, 0]), atol=1e-5, rtol=0)
    # none: centred over the valid rows; batch: / std of the rows that get an advantage ([1, 0, 1])
    torch.testing.assert_close(group_advantages(r, 4, valid=valid, scale="none")[:4],
                               torch.tensor([1 / 3, -2 / 3, 0, 1 / 3]))
    torch.testing.assert_close(group_advantages(r, 4, valid=valid, scale="batch", eps=0.0)[:4],
                               torch.tensor([1 / 3, -2 / 3, 0, 1 / 3]) / math.sqrt(1 / 3))
    # all valid: the same as no mask, under every scale (another path, the same formulas)
    x = torch.randn(12)
    for scale in ("group", "batch", "none"):
        torch.testing.assert_close(
            group_advantages(x, 4, scale=scale),
            __import__("grpo.math.algorithm", fromlist=["_"])._partial_group_advantages(
                x.view(-1, 4), torch.ones(3, 4, dtype=torch.bool), scale, 1e-6).reshape(-1))


def test_a_group_varies_over_its_valid_rows_only():
    from grpo.math.algorithm import group_varies

    grouped = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 5.0, 5.0]])
    valid = torch.tensor([[True, False, False], [True, True, False], [False, True, True]])
    assert group_varies(grouped).tolist() == [True, True, True]
    assert group_varies(grouped, valid).tolist() == [False, False, False]  # one valid; [1, 1]; [5, 5]
    # rewards below 0 (a format penalty, a reward in [-1, 1]): an errored row must not count as a 0 either
    negative = torch.tensor([[-1.0, 0.0, -1.0], [-0.5, -0.5, 3.0]])
    valid = torch.tensor([[True, False, True], [True, True, False]])
    assert group_varies(negative, valid).tolist() == [False, False]


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="divisible by group_size=4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale must be"):
        group_advantages(torch.zeros(4), 2, scale="rank")


def test_ratio_of_e_is_clipped_to_1_2_for_positive_advantage():
    # logp - old_logp = 1 -> ratio e = 2.718 > 1.2; with A = 1 the clipped term
    # min(e * 1, 1.2 * 1) = 1.2 wins, so the per-token loss is -1.2 and its
    # gradient is zero (the clip is active).
    logp = torch.ones(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2)
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0
    assert m["clip_frac_high"].item() == 1.0 and m["clip_frac_low"].item() == 0.0
    assert m["ratio_mean"].item() == pytest.approx(math.e, rel=1e-6)


def test_ratio_of_e_with_negative_advantage_is_not_clipped():
    # A = -1: min(e * -1, 1.2 * -1) = -e, so the loss is +e and the gradient
    # is d(e^x)/dx = e per token, divided by 3 tokens.
    logp = torch.ones(1, 3, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3))
    assert loss.item() == pytest.approx(math.e, rel=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 3), math.e / 3))


def test_clip_higher_and_low_fraction():
    # ratio = exp(-1) = 0.368 < 1 - 0.2 with A < 0: clipped from below;
    # ratio = exp(0.25) = 1.284: inside [0.8, 1.28]? no, 1.284 > 1.28 -> clipped high (A > 0).
    logp = torch.tensor([[-1.0], [0.25]])
    loss, m = policy_loss(logp, torch.zeros(2, 1), torch.tensor([-1.0, 1.0]), torch.ones(2, 1),
                          clip_low=0.2, clip_high=0.28)
    assert m["clip_frac_low"].item() == pytest.approx(0.5)
    assert m["clip_frac_high"].item() == pytest.approx(0.5)
    # token 1: -min(0.368*-1, 0.8*-1) = 0.8 ; token 2: -min(1.284, 1.28) = -1.28 ; mean -0.24
    assert loss.item() == pytest.approx((0.8 - 1.28) / 2, abs=1e-6)
    # each bound on its own side (the mean above would not tell 0.8 and 1.28 from 0.72 and 1.2):
    # ratio exp(0.22) = 1.246 with A > 0 is inside [0.8, 1.28]; exp(-0.25) = 0.779 with A < 0 is below 0.8
    for value, adv, expected in ((0.22, 1.0, -math.exp(0.22)), (-0.25, -1.0, 0.8)):
        loss, _ = policy_loss(torch.tensor([[value]]), torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1),
                              clip_low=0.2, clip_high=0.28)
        assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_a_group_of_equal_rewards_does_not_vary():
    from grpo.math.algorithm import group_varies

    assert group_varies(torch.tensor([[0.5, 0.5, 0.5], [0.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])).tolist() == [
        False, True, False]


def test_k3_kl_values():
    # delta = ref - logp = ln 2 -> 2 - ln 2 - 1 = 0.306853; delta = 0 -> 0
    kl = k3_kl(torch.tensor([0.0, 0.0]), torch.tensor([math.log(2.0), 0.0]))
    torch.testing.assert_close(kl, torch.tensor([1.0 - math.log(2.0), 0.0]))


def test_kl_term_added_with_beta():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))
    # ratio 1, A = 0 -> surrogate 0; beta 0.5 * k3 0.306853 per token; token mean 0.153426
    loss, m = policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, beta=0.5)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)), rel=1e-6)
    assert m["kl"].item() == pytest.approx(1 - math.log(2.0), rel=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), beta=0.5)


def test_each_aggregate_by_hand():
    # sequence 1 has 1 valid token with loss 4; sequence 2 has 3 valid tokens with loss 1 each.
    per_token = torch.tensor([[4.0, 9.0, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # token: (4 + 3) / 4 tokens = 1.75
    assert aggregate_loss(per_token, mask, mode="token").item() == pytest.approx(1.75)
    # sequence: mean(4/1, 3/3) = 2.5
    assert aggregate_loss(per_token, mask, mode="sequence").item() == pytest.approx(2.5)
    # fixed: 7 / (2 sequences * max_tokens 5) = 0.7
    assert aggregate_loss(per_token, mask, mode="fixed", max_tokens=5).item() == pytest.approx(0.7)


def test_a_sequence_masked_whole_leaves_the_sequence_normalisers():
    # DAPO's overlong filter masks a cut completion whole: sequence 2 below has no token in the loss
    per_token = torch.tensor([[4.0, 9.0, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # sequence: 4/1 over 1 sequence = 4 (counting the masked one would give 2)
    assert aggregate_loss(per_token, mask, mode="sequence").item() == pytest.approx(4.0)
    # fixed: 4 / (1 sequence * max_tokens 5) = 0.8 (not 0.4)
    assert aggregate_loss(per_token, mask, mode="fixed", max_tokens=5).item() == pytest.approx(0.8)


def test_gspo_sequence_ratio_is_geometric_mean():
    # token log-ratios 0.1 and 0.3 -> s = exp(0.2), the same for both tokens
    logp = torch.tensor([[0.1, 0.3, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, m = policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, ratio_level="sequence",
                       clip_high=1.0)
    assert m["ratio_mean"].item() == pytest.approx(math.exp(0.2), rel=1e-6)


@pytest.mark.parametrize("aggregate", ["token", "sequence", "fixed"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(aggregate, ratio_level):
    torch.manual_seed(0)
    n, t = 6, 5
    base = torch.randn(n, t)
    old = base + 0.1 * torch.randn(n, t)
    ref = base + 0.1 * torch.randn(n, t)
    adv = torch.randn(n)
    mask = (torch.rand(n, t) > 0.3).float()
    mask[:, 0] = 1.0
    kw = dict(beta=0.1, aggregate=aggregate, ratio_level=ratio_level, max_tokens=t)

    full = base.clone().requires_grad_(True)
    loss, _ = policy_loss(full, old, adv, mask, ref_logp=ref, **kw)
    loss.backward()

    parts = base.clone().requires_grad_(True)
    total_loss = 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part, _ = policy_loss(parts[rows], old[rows], adv[rows], mask[rows], ref_logp=ref[rows],
                              total_tokens=mask.sum().item(), total_sequences=n, **kw)
        part.backward()
        total_loss += part.item()
    assert total_loss == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(parts.grad, full.grad, rtol=1e-6, atol=1e-7)


def test_tis_weights_cap_token_ratios():
    # delta = trainer - sampler = [0, ln 3, -ln 2] -> ratios [1, 3, 0.5]; cap 2 -> weights [1, 2, 0.5];
    # the 4th token is padding (weight 0). One of three valid tokens is capped.
    trainer = torch.tensor([[-1.0, math.log(3.0) - 2.0, -math.log(2.0) - 1.0, 5.0]])
    sampler = torch.tensor([[-1.0, -2.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, m = tis_weights(trainer, sampler, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.5, 0.0]]))
    assert m["tis_capped_frac"].item() == pytest.approx(1 / 3)
    # mean |delta| = (0 + ln 3 + ln 2) / 3
    assert m["sampler_logp_diff"].item() == pytest.approx((math.log(3) + math.log(2)) / 3, rel=1e-6)
    # max |delta| over the valid tokens: ln 3 (the padding's delta, 5 - 0, is left out)
    assert m["sampler_logp_diff_max"].item() == pytest.approx(math.log(3), rel=1e-6)
    # k3 KL(sampler || trainer) per token = r - 1 - ln r with r = pi_trainer / pi_sampler:
    #   r = 1: 0; r = 3: 2 - ln 3; r = 0.5: -0.5 + ln 2
    expected = (0 + (2 - math.log(3)) + (-0.5 + math.log(2))) / 3
    assert m["sampler_kl"].item() == pytest.approx(expected, rel=1e-5)


def test_tis_weights_mask_whole_sequences():
    # row 0: deltas [0.1, 0.3] -> mean 0.2, exp 1.22 in [1/2, 2]: kept (weights 1);
    # row 1: deltas [1.0, 0.6] -> mean 0.8 > ln 2 = 0.693: masked (weights 0), its 2 tokens count as capped
    trainer = torch.tensor([[0.1, 0.3], [1.0, 0.6]])
    sampler = torch.zeros(2, 2)
    w, m = tis_weights(trainer, sampler, torch.ones(2, 2), cap=2.0, level="sequence")
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    assert m["tis_capped_frac"].item() == pytest.approx(0.5)
    # and below: a mean log-ratio of -0.8 (exp 0.45 < 1/2) is masked too, -0.5 (0.61) is kept
    w, _ = tis_weights(-trainer, sampler, torch.ones(2, 2), cap=2.0, level="sequence")  # means -0.2, -0.8
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    w, _ = tis_weights(torch.tensor([[-0.5, -0.5]]), torch.zeros(1, 2), torch.ones(1, 2), cap=2.0, level="sequence")
    torch.testing.assert_close(w, torch.ones(1, 2))
    with pytest.raises(ValueError, match="tis_level must be"):
        tis_weights(trainer, sampler, torch.ones(2, 2), cap=2.0, level="batch")


def test_tis_weight_scales_the_surrogate_not_the_kl():
    # on-policy (ratio 1), A = 1, one token: surrogate -1 times weight 0.5 -> -0.5; with beta = 1 and
    # ref = logp the KL term is 0, so the loss is -0.5; the gradient of the surrogate is -w * rho = -0.5
    logp = torch.zeros(1, 1, requires_grad=True)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 1),
                          ref_logp=torch.zeros(1, 1), beta=1.0, tis_weight=torch.tensor([[0.5]]))
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5]]))


def test_learning_rate_warms_up_linearly_then_stays():
    from grpo.config import TrainConfig
    from grpo.learning.update import learning_rate

    config = TrainConfig(lr=1e-3, warmup_steps=3)
    assert [learning_rate(config, s) for s in (1, 2, 3, 4, 10)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert learning_rate(TrainConfig(lr=1e-3, warmup_steps=0), 1) == 1e-3


def test_micro_step_records_add_up_to_the_steps_token_means():
    from grpo.learning.step_stats import MicroResult, StepStats, add_micro, whole_batch_stats
    from grpo.system.distributed import World

    # two micro-batches of 3 and 1 tokens: ratio_mean 1.0 and 2.0 -> (3 * 1 + 1 * 2) / 4 = 1.25; entropy
    # sums 0.6 and 0.2 -> 0.2 a token; loss summed over the micro-batches, over 2 optimiser steps: -0.4 / 2;
    # the mismatch's max 0.3 (the first's: a max, not the latest); 1 of the 2 + 1 completions masked -> 1/3;
    # a third micro-step without TIS (no max, no sequence counts) and with no tokens changes none of them
    first = MicroResult(loss=-0.1, weight=3.0, metrics={"ratio_mean": 3.0}, entropy=0.6, trained_sequences=2,
                        logp_diff_max=0.3, sequences=2.0, masked_sequences=1.0)
    second = MicroResult(loss=-0.3, weight=1.0, metrics={"ratio_mean": 2.0}, entropy=0.2, trained_sequences=1,
                         logp_diff_max=0.1, sequences=1.0, masked_sequences=0.0)
    third = MicroResult(loss=0.0, weight=0.0, metrics={"ratio_mean": 0.0}, entropy=0.0, trained_sequences=0,
                        logp_diff_max=None, sequences=None, masked_sequences=None)
    stats, sums = StepStats(optimizer_steps=2), {"weight": 0.0}
    for micro in (first, second, third):
        add_micro(sums, stats, micro)
    stats = whole_batch_stats(World(), stats, sums)
    assert stats.ratio_mean == pytest.approx(1.25) and stats.entropy == pytest.approx(0.2)
    assert stats.loss == pytest.approx(-0.2) and stats.trained_sequences == 3
    assert stats.sampler_logp_diff_max == 0.3 and stats.tis_masked_sequences == pytest.approx(1 / 3)
    assert first.metrics == {"ratio_mean": 3.0}  # the record is not changed by adding it
