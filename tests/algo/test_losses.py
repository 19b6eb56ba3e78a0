"""PPO losses, KL pieces and guards against hand-computed numbers and plain formulas."""

import math

import pytest
import torch

from grl.algo import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    entropy_bonus,
    entropy_from_logits,
    finite_rows,
    kl_estimate,
    kl_loss,
    log_probs_from_logits,
    make_kl_controller,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    value_loss,
)

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


# ---- aggregation ------------------------------------------------------------------------------------

LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = t([[1, 1, 0], [1, 1, 1], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 4 + 5 + 6) / 5),
        ("seq-mean-token-sum", (3 + 15) / 2),  # the all-masked row is left out
        ("seq-mean-token-mean", (1.5 + 5.0) / 2),
    ],
)
def test_agg_loss_modes(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_ignores_nan_outside_mask():
    dirty = LOSS.clone()
    dirty[0, 2], dirty[2, 0] = float("nan"), float("inf")
    assert agg_loss(dirty, MASK, "seq-mean-token-mean").item() == pytest.approx(3.25)
    assert agg_loss(dirty, torch.zeros_like(MASK)).item() == 0.0


# ---- policy loss --------------------------------------------------------------------------------------

RATIOS = [1.5, 0.7, 0.5, 5.0, 1.1]
ADVS = [1.0, 1.0, -1.0, -1.0, 2.0]


def policy_inputs():
    old = t([[-1.0] * 6])
    new = old + torch.log(t([RATIOS + [1.0]]))
    new[0, 5] = float("nan")  # a pad position: NaN log-prob and inf advantage must not leak
    adv = t([ADVS + [float("inf")]])
    mask = t([[1, 1, 1, 1, 1, 0]])
    return new.requires_grad_(), old, adv, mask


def test_policy_loss_clip_higher_and_dual_clip_by_hand():
    new, old, adv, mask = policy_inputs()
    loss, m = policy_loss(new, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    # per token: max(-A r, -A clip(r, 0.8, 1.28)), then min with -A*3 where A < 0
    per_token = [
        -1.28,  # r 1.5 clipped at the higher bound 1.28 (not 1.2)
        -0.7,  # r 0.7 with A > 0: the unclipped term is the max
        0.8,  # r 0.5 with A < 0: clipped at the lower bound 0.8
        3.0,  # r 5.0 with A < 0: max is 5.0, dual-clip caps it at 3
        -2.2,
    ]  # r 1.1 inside the trust region
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    assert m["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    assert m["ppo_kl"].item() == pytest.approx(-sum(math.log(r) for r in RATIOS) / 5)
    loss.backward()
    grad = new.grad[0]
    assert torch.isfinite(grad).all()
    # d loss / d log p = -A r / 5 where the unclipped term is active, else 0
    expected = [0.0, -1.0 * 0.7 / 5, 0.0, 0.0, -2.0 * 1.1 / 5, 0.0]
    torch.testing.assert_close(grad, t(expected), atol=1e-12, rtol=0)


def test_policy_loss_symmetric_clip_and_no_dual_clip():
    new, old, adv, mask = policy_inputs()
    loss, m = policy_loss(new, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None)
    assert loss.item() == pytest.approx((-1.2 - 0.7 + 0.8 + 5.0 - 2.2) / 5)
    assert m["pg_clipfrac_lower"].item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_loss_aggregates_like_agg_loss(mode):
    g = torch.Generator().manual_seed(0)
    new, old, adv = (torch.randn(4, 7, generator=g, dtype=F64) for _ in range(3))
    mask = (torch.rand(4, 7, generator=g) > 0.3).to(F64)
    ratio = (new - old).exp()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.3))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    loss, _ = policy_loss(new, old, adv, mask, 0.2, 0.3, 3.0, mode)
    assert loss.item() == pytest.approx(agg_loss(per_token, mask, mode).item())


# ---- value loss, entropy, log-probs ---------------------------------------------------------------------


def test_value_loss_clipping_by_hand():
    pred = t([[1.0, 2.0, 0.0, float("nan")]]).requires_grad_()
    old, ret = t([[0.0, 2.5, 0.0, float("inf")]]), t([[2.0, 0.0, 1.0, float("nan")]])
    mask = t([[1, 1, 1, 0]])
    loss, m = value_loss(pred, old, ret, mask, cliprange_value=0.5)
    # token 0: clipped to 0.5 -> (0.5-2)^2 = 2.25 beats (1-2)^2 = 1; token 1: 4 vs 4; token 2: 1 vs 1
    assert loss.item() == pytest.approx(0.5 * (2.25 + 4.0 + 1.0) / 3)
    assert m["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # token 0's clipped branch is flat in pred; tokens 1, 2: d/dv 0.5 * (v - R)^2 / 3; pad: 0
    torch.testing.assert_close(pred.grad, t([[0.0, 2.0 / 3, -1.0 / 3, 0.0]]), atol=1e-12, rtol=0)
    plain, m = value_loss(pred, old, ret, mask, cliprange_value=None)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 4.0 + 1.0) / 3)


def test_entropy_and_log_probs_from_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 11, generator=g, dtype=F64) * 3
    labels = torch.randint(0, 11, (2, 5), generator=g)
    ent = entropy_from_logits(logits)
    for b in range(2):
        for i in range(5):
            z = logits[b, i].tolist()
            norm = math.log(sum(math.exp(x) for x in z))
            probs = [math.exp(x - norm) for x in z]
            assert ent[b, i].item() == pytest.approx(-sum(p * math.log(p) for p in probs))
    torch.testing.assert_close(entropy_from_logits(logits, chunk_size=3), ent)
    lp = log_probs_from_logits(logits, labels, chunk_size=4)
    torch.testing.assert_close(lp, torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1))
    half = logits.to(torch.bfloat16)
    lp_half = log_probs_from_logits(half, labels)
    assert lp_half.dtype == torch.float32  # computed in fp32 from the exact bf16 values
    torch.testing.assert_close(
        lp_half, torch.log_softmax(half.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    )
    torch.testing.assert_close(entropy_from_logits(half, chunk_size=4), entropy_from_logits(half.float()))
    mask = t([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    assert entropy_bonus(ent, mask).item() == pytest.approx(masked_mean(ent, mask).item())


# ---- KL ---------------------------------------------------------------------------------------------------


KL_FORMULAS = [
    ("kl", lambda d: d),
    ("k1", lambda d: d),
    ("abs", abs),
    ("mse", lambda d: 0.5 * d * d),
    ("k2", lambda d: 0.5 * d * d),
    ("low_var_kl", lambda d: math.exp(-d) + d - 1),
    ("k3", lambda d: math.exp(-d) + d - 1),
]


def test_every_kl_estimator_a_config_may_name_has_its_formula_here():
    from grl.schema.workers import KL_ESTIMATORS

    assert set(KL_ESTIMATORS) <= {kind for kind, _ in KL_FORMULAS}


@pytest.mark.parametrize("kind, formula", KL_FORMULAS)
def test_kl_estimators_match_formulas(kind, formula):
    logp, ref = t([-0.3, -2.0, -1.0, -0.01]), t([-1.3, -0.5, -1.0, -4.0])
    out = kl_estimate(logp, ref, kind)
    for i in range(4):
        assert out[i].item() == pytest.approx(formula(logp[i].item() - ref[i].item()))


def test_low_var_kl_is_clamped_and_unknown_kind_raises():
    logp, ref = t([-60.0, 0.0, -1000.0]), t([0.0, -60.0, 0.0])
    out = kl_estimate(logp, ref, "low_var_kl")
    # k3 would be exp(60) - 61, exp(-60) + 59 and about 1e434: all capped at 10 as verl does, and never inf
    assert out.tolist() == [10.0, 10.0, 10.0]
    with pytest.raises(ValueError, match="kl, abs, mse, low_var_kl"):
        kl_estimate(logp, ref, "full")


def test_apply_kl_penalty():
    rewards = t([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    logp = t([[-1.0, -1.0, -3.0, float("nan")], [-2.0, -1.5, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    ref = t([[-1.5, -0.5, -3.0, 0.0], [-2.5, -1.5, -1.0, -2.0], [0.0, 0.0, 0.0, 0.0]])
    mask = t([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    new, mean_kl = apply_kl_penalty(rewards, logp, ref, mask, kl_coef=0.1, kl_penalty="kl")
    expected = t(
        [[0.0 - 0.1 * 0.5, 1.0 + 0.1 * 0.5, 0.0, 0.0], [-0.1 * 0.5, 0.0, 2.0, 0.0], [5.0, 0.0, 0.0, 0.0]]
    )
    torch.testing.assert_close(new, expected)
    # row means: row 0 (0.5 - 0.5)/2 = 0, row 1 0.5/3; the empty row is left out
    assert mean_kl.item() == pytest.approx((0.0 + 0.5 / 3) / 2)


def test_kl_loss_aggregates_estimator():
    logp, ref, mask = t([[-1.0, -2.0, -0.5]]), t([[-1.5, -1.0, -0.5]]), t([[1, 1, 0]])
    expected = sum(math.exp(-d) + d - 1 for d in (0.5, -1.0)) / 2
    assert kl_loss(logp, ref, mask, "low_var_kl").item() == pytest.approx(expected)


def test_kl_controllers():
    fixed = FixedKLController(0.05)
    fixed.update(10.0, 256)
    assert fixed.value == 0.05
    ctrl = AdaptiveKLController(0.1, target_kl=0.05, horizon=1000)
    ctrl.update(0.055, 100)  # error +10% -> value * (1 + 0.1 * 100 / 1000)
    assert ctrl.value == pytest.approx(0.1 * 1.01)
    ctrl.update(1.0, 100)  # error clipped at +20%
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02)
    ctrl.update(0.0, 500)  # error clipped at -20%
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02 * 0.9)
    assert isinstance(make_kl_controller("adaptive", 0.1, 0.05, 1000), AdaptiveKLController)
    assert isinstance(make_kl_controller("fixed", 0.1), FixedKLController)


# ---- masked statistics and guards ------------------------------------------------------------------------


def test_masked_stats_against_python():
    x = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 7.0]])
    mask = t([[1, 1, 0], [1, 0, 1]])
    vals = [1.0, 2.0, 4.0, 7.0]
    mean = sum(vals) / 4
    var = sum((v - mean) ** 2 for v in vals) / 3
    assert masked_mean(x, mask).item() == pytest.approx(mean)
    assert masked_var(x, mask).item() == pytest.approx(var)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(var * 3 / 4)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), t([1.5, 5.5]))
    w = masked_whiten(x, mask)
    torch.testing.assert_close(
        w,
        t(
            [
                [(v - mean) / math.sqrt(var + 1e-8) for v in (1.0, 2.0)] + [0.0],
                [(4.0 - mean) / math.sqrt(var + 1e-8), 0.0, (7.0 - mean) / math.sqrt(var + 1e-8)],
            ]
        ),
    )
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False), torch.where(mask > 0, w + mean, 0.0))


def test_finite_rows():
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = t([[0.0, 1.0, float("nan")], [0.0, float("inf"), 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    ratio = t([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, float("nan"), 1.0]])
    scores = t([0.0, 1.0, float("-inf"), 1.0])
    ok = finite_rows(adv, ratio, scores, loss_mask=mask)
    assert ok.tolist() == [True, False, False, False]
    assert finite_rows(adv).tolist() == [False, False, True, True]
    with pytest.raises(ValueError, match="shape"):
        finite_rows(torch.zeros(2, 2, 2))
