"""Golden values of the PPO-clip loss against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.rl.losses import ppo_clip_loss


def numpy_ppo(logp, old, adv, mask, lo=0.2, hi=0.28, behaviour=None, cap=None, ref=None, kl=0.0):
    ratio = np.exp(np.clip(logp - old, -20, 20))
    adv = adv[:, None] if adv.ndim == 1 else adv
    per = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi))
    if cap is not None:
        per = per * np.minimum(np.exp(old - behaviour), cap)
    if kl:
        r = ref - logp
        per = per + kl * (np.exp(r) - r - 1)
    return (per * mask).sum(), mask.sum()


def data(seed=0, b=4, t=6):
    rng = np.random.default_rng(seed)
    logp = -rng.random((b, t)) * 3
    old = logp + rng.normal(scale=0.4, size=(b, t))
    return (logp.astype(np.float32), old.astype(np.float32), rng.normal(size=b).astype(np.float32),
            (rng.random((b, t)) > 0.3).astype(np.float32), rng)


def test_matches_numpy_reference_with_asymmetric_clip():
    logp, old, adv, mask, _ = data()
    total, count, _ = ppo_clip_loss(logp, old, adv, mask)
    ref_total, ref_count = numpy_ppo(logp, old, adv, mask)
    np.testing.assert_allclose(total, ref_total, rtol=1e-5)
    assert count == ref_count


def test_golden_values_per_token():
    # ratio 1.5 with A=+1 clips at 1.28; ratio 0.5 with A=-1 clips at 0.8; ratio 1 is REINFORCE
    logp = np.log(np.array([[1.5, 0.5, 1.0]], np.float32))
    old = np.zeros((1, 3), np.float32)
    for adv, expected in [(1.0, -(1.28 + 0.5 + 1.0)), (-1.0, 1.5 + 0.8 + 1.0)]:
        total, count, _ = ppo_clip_loss(logp, old, np.array([adv], np.float32), np.ones((1, 3)))
        np.testing.assert_allclose(total, expected, rtol=1e-6)
        assert count == 3


def test_token_level_advantages_tis_and_kl():
    logp, old, _, mask, rng = data(1)
    adv = rng.normal(size=logp.shape).astype(np.float32)
    behaviour = (old + rng.normal(scale=0.5, size=old.shape)).astype(np.float32)
    ref = (logp + rng.normal(scale=0.2, size=old.shape)).astype(np.float32)
    total, _, metrics = ppo_clip_loss(logp, old, adv, mask, behaviour_logp=behaviour, tis_cap=2.0,
                                      ref_logp=ref, kl_coef=0.1)
    expected, _ = numpy_ppo(logp, old, adv, mask, behaviour=behaviour, cap=2.0, ref=ref, kl=0.1)
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    assert "kl" in metrics


def test_gradient_at_ratio_one_is_reinforce():
    logp, _, adv, mask, _ = data(2)
    grad = jax.grad(lambda lp: ppo_clip_loss(lp, jnp.asarray(logp), adv, mask)[0])(logp)
    np.testing.assert_allclose(grad, -adv[:, None] * mask, rtol=1e-6)


def test_tis_weights_are_one_when_policies_agree():
    logp, old, adv, mask, _ = data(3)
    plain = ppo_clip_loss(logp, old, adv, mask)[0]
    weighted = ppo_clip_loss(logp, old, adv, mask, behaviour_logp=old, tis_cap=2.0)[0]
    np.testing.assert_allclose(plain, weighted, rtol=1e-6)
