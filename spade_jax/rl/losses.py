"""PPO-clip policy-gradient loss with asymmetric clipping, TIS weights, KL, and its aggregation.

Losses come back as a weighted sum plus the token and sample counts it covers: the train step
adds the sums of every micro-batch and divides once by `LossAggregation.denominator`, so the
mean is the same however a batch is split into micro-batches (gradient accumulation is exact).
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

KL_CLAMP = 10.0  # Slime's low_var_kl clamps each token's estimate to [-10, 10]


class LossAggregation(enum.StrEnum):
    """How the per-token losses of one optimizer step become one number.

    token_mean: every generated token of the step weighs the same (sum / generated tokens).
    sample_mean: each sample's token mean, summed, divided by the number of samples (Slime's
    default `sum_of_sample_mean` / global batch size): a long sample weighs no more than a
    short one.
    """

    TOKEN_MEAN = "token_mean"
    SAMPLE_MEAN = "sample_mean"

    def token_weights(self, loss_mask: jax.Array) -> jax.Array:
        """[B, T] weight of each token in the loss's numerator (0 off the loss mask)."""
        mask = loss_mask.astype(jnp.float32)
        if self is LossAggregation.TOKEN_MEAN:
            return mask
        return mask / jnp.maximum(mask.sum(axis=-1, keepdims=True), 1.0)

    def denominator(self, tokens, samples):
        """What the summed numerator is divided by: generated tokens, or samples."""
        return tokens if self is LossAggregation.TOKEN_MEAN else samples


def tis_weight(old_logp: jax.Array, behaviour_logp: jax.Array, cap: float) -> jax.Array:
    """Truncated importance weight min(exp(old - behaviour), cap) of each token (Slime TIS)."""
    return jnp.minimum(jnp.exp(old_logp - behaviour_logp), cap)


def low_var_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(policy || reference): exp(r) - r - 1 with r = ref - logp,
    clamped at KL_CLAMP as Slime's `low_var_kl`. r is first clipped to ±20, which changes no
    value (the estimate is above the clamp there) but keeps exp(r) and its gradient finite."""
    r = jnp.clip(ref_logp - logp, -20.0, 20.0)
    return jnp.minimum(jnp.exp(r) - r - 1.0, KL_CLAMP)


def ppo_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    behaviour_logp: jax.Array | None = None,
    tis_cap: float | None = None,
    ref_logp: jax.Array | None = None,
    kl_coef: float = 0.0,
    aggregation: LossAggregation = LossAggregation.TOKEN_MEAN,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clip loss; all per-token arrays are [B, T], advantages [B] or [B, T].

    per token: ratio = exp(logp - old_logp) (log-ratio clipped to ±20 for safety),
      pg = max(-A·ratio, -A·clip(ratio, 1 - clip_low, 1 + clip_high)).
    TIS (Slime `--use-tis`): with `behaviour_logp` (the sampler's log-prob) and `tis_cap`, pg is
    multiplied by the constant `tis_weight(old_logp, behaviour_logp, tis_cap)`.
    KL (off unless kl_coef > 0): kl_coef · `low_var_kl(logp, ref_logp)` is added per token.
    Returns (loss numerator, sums): the numerator weighs tokens by `aggregation.token_weights`;
    sums holds `tokens` and `samples` (rows with a loss token) for the denominator, and metric
    sums over loss-mask tokens (divide by `tokens` for means).
    """
    mask = loss_mask.astype(jnp.float32)
    adv = advantages.astype(jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    log_ratio = jnp.clip(logp - old_logp, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = jnp.maximum(unclipped, clipped)
    sums = {
        "tokens": jnp.sum(mask),
        "samples": jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32)),
        "clip_fraction": jnp.sum((clipped > unclipped) * mask),
        "ratio": jnp.sum(ratio * mask),
        "approx_kl": jnp.sum(0.5 * jnp.square(log_ratio) * mask),
    }
    if tis_cap is not None and behaviour_logp is not None:
        weight = jax.lax.stop_gradient(tis_weight(old_logp, behaviour_logp, tis_cap))
        per_token = per_token * weight
        sums["tis_weight"] = jnp.sum(weight * mask)
        sums["tis_clip_fraction"] = jnp.sum(
            (jax.lax.stop_gradient(old_logp - behaviour_logp) > jnp.log(tis_cap)) * mask)
    if kl_coef and ref_logp is not None:
        kl = low_var_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        sums["kl"] = jnp.sum(kl * mask)
    return jnp.sum(per_token * aggregation.token_weights(loss_mask)), sums
