"""Golden values of the PPO-clip loss, the TIS weight, the k3 KL and the loss aggregations
against NumPy references and hand-computed numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.rl.losses import LossAggregation, low_var_kl, ppo_clip_loss, tis_weight


def numpy_ppo(logp, old, adv, mask, lo=0.2, hi=0.28, behaviour=None, cap=None, ref=None, kl=0.0,
              aggregation="token_mean"):
    """(numerator, denominator) of the loss, written out per sample as Slime's reducers do."""
    ratio = np.exp(np.clip(logp - old, -20, 20))
    adv = adv[:, None] if adv.ndim == 1 else adv
    per = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi))
    if cap is not None:
        per = per * np.minimum(np.exp(old - behaviour), cap)
    if kl:
        r = ref - logp
        per = per + kl * np.minimum(np.exp(r) - r - 1, 10.0)
    if aggregation == "token_mean":  # sum_of_token / tokens
        return (per * mask).sum(), mask.sum()
    rows = [(p * m).sum() / max(m.sum(), 1) for p, m in zip(per, mask, strict=True)]
    return sum(rows), sum(m.sum() > 0 for m in mask)  # sum_of_sample_mean / samples


def data(seed=0, b=4, t=6):
    rng = np.random.default_rng(seed)
    logp = -rng.random((b, t)) * 3
    old = logp + rng.normal(scale=0.4, size=(b, t))
    return (logp.astype(np.float32), old.astype(np.float32), rng.normal(size=b).astype(np.float32),
            (rng.random((b, t)) > 0.3).astype(np.float32), rng)


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_matches_numpy_reference_with_asymmetric_clip(aggregation):
    logp, old, adv, mask, _ = data()
    mask[2] = 0.0  # a padding row: no tokens, not a sample
    total, sums = ppo_clip_loss(logp, old, adv, mask, aggregation=aggregation)
    ref_total, ref_denominator = numpy_ppo(logp, old, adv, mask, aggregation=aggregation)
    np.testing.assert_allclose(total, ref_total, rtol=1e-5)
    assert aggregation.denominator(sums["tokens"], sums["samples"]) == ref_denominator
    assert sums["tokens"] == mask.sum() and sums["samples"] == 3


def test_golden_values_per_token():
    # ratio 1.5 with A=+1 clips at 1.28; ratio 0.5 with A=-1 clips at 0.8; ratio 1 is REINFORCE
    logp = np.log(np.array([[1.5, 0.5, 1.0]], np.float32))
    old = np.zeros((1, 3), np.float32)
    for adv, expected in [(1.0, -(1.28 + 0.5 + 1.0)), (-1.0, 1.5 + 0.8 + 1.0)]:
        total, sums = ppo_clip_loss(logp, old, np.array([adv], np.float32), np.ones((1, 3)))
        np.testing.assert_allclose(total, expected, rtol=1e-6)
        assert sums["tokens"] == 3


def test_sample_mean_golden_values():
    """Two samples with losses [1, 2, 3] and [10]: token mean 16 / 4 = 4, sample mean
    (2 + 10) / 2 = 6 (Slime's sum_of_sample_mean over the global batch size)."""
    per_token_adv = np.array([[-1.0, -2.0, -3.0], [-10.0, 0.0, 0.0]], np.float32)  # -A = loss
    mask = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    zeros = np.zeros((2, 3), np.float32)
    for aggregation, expected in [(LossAggregation.TOKEN_MEAN, 4.0),
                                  (LossAggregation.SAMPLE_MEAN, 6.0)]:
        total, sums = ppo_clip_loss(zeros, zeros, per_token_adv, mask, aggregation=aggregation)
        denominator = aggregation.denominator(sums["tokens"], sums["samples"])
        np.testing.assert_allclose(total / denominator, expected, rtol=1e-6)


def test_tis_weight_golden_values():
    # exp(old - behaviour): 4 -> capped at 2, 0.5 and 1 kept; cap 5 keeps 4
    old = np.log(np.array([4.0, 0.5, 1.0], np.float32))
    behaviour = np.zeros(3, np.float32)
    np.testing.assert_allclose(tis_weight(old, behaviour, 2.0), [2.0, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(tis_weight(old, behaviour, 5.0), [4.0, 0.5, 1.0], rtol=1e-6)


def test_low_var_kl_golden_values():
    # k3 = exp(r) - r - 1, r = ref - logp: r = ln 2 -> 1 - ln 2; r = -1 -> 1/e; r = 0 -> 0;
    # r = 3 -> e^3 - 4 = 16.09, clamped at 10 (Slime's low_var_kl); r = 500 stays finite
    r = np.array([np.log(2.0), -1.0, 0.0, 3.0, 500.0], np.float32)
    logp = np.full(5, -2.0, np.float32)
    got = np.asarray(low_var_kl(logp, logp + r))
    np.testing.assert_allclose(got, [1 - np.log(2.0), np.exp(-1.0), 0.0, 10.0, 10.0], rtol=1e-6)
    grad = jax.grad(lambda lp: low_var_kl(lp, jnp.asarray(logp + r)).sum())(jnp.asarray(logp))
    np.testing.assert_allclose(grad[:3], 1 - np.exp(r[:3]), rtol=1e-6)  # d/dlogp = 1 - e^r
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_token_level_advantages_tis_and_kl(aggregation):
    logp, old, _, mask, rng = data(1)
    adv = rng.normal(size=logp.shape).astype(np.float32)
    behaviour = (old + rng.normal(scale=0.5, size=old.shape)).astype(np.float32)
    ref = (logp + rng.normal(scale=0.2, size=old.shape)).astype(np.float32)
    total, sums = ppo_clip_loss(logp, old, adv, mask, behaviour_logp=behaviour, tis_cap=2.0,
                                ref_logp=ref, kl_coef=0.1, aggregation=aggregation)
    expected, _ = numpy_ppo(logp, old, adv, mask, behaviour=behaviour, cap=2.0, ref=ref, kl=0.1,
                            aggregation=aggregation)
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    weights = np.minimum(np.exp(old - behaviour), 2.0)
    np.testing.assert_allclose(sums["tis_weight"], (weights * mask).sum(), rtol=1e-5)
    assert sums["tis_clip_fraction"] == ((np.exp(old - behaviour) > 2.0) * mask).sum() > 0
    r = ref - logp
    np.testing.assert_allclose(sums["kl"], ((np.exp(r) - r - 1) * mask).sum(), rtol=1e-5)


def test_gradient_at_ratio_one_is_reinforce():
    logp, _, adv, mask, _ = data(2)
    grad = jax.grad(lambda lp: ppo_clip_loss(lp, jnp.asarray(logp), adv, mask)[0])(logp)
    np.testing.assert_allclose(grad, -adv[:, None] * mask, rtol=1e-6)


def test_tis_weights_are_one_when_policies_agree():
    logp, old, adv, mask, _ = data(3)
    plain = ppo_clip_loss(logp, old, adv, mask)[0]
    weighted = ppo_clip_loss(logp, old, adv, mask, behaviour_logp=old, tis_cap=2.0)[0]
    np.testing.assert_allclose(plain, weighted, rtol=1e-6)
