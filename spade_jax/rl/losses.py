"""PPO-clip policy-gradient loss with asymmetric clipping, optional TIS weights and KL.

Losses come back as (sum over loss-mask tokens, token count): dividing the summed sums by the
summed counts gives the token-mean over a whole batch however it is split into micro-batches,
so gradient accumulation is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Token-level PPO-clip loss; all per-token arrays are [B, T], advantages [B] or [B, T].

    per token: ratio = exp(logp - old_logp) (log-ratio clipped to ±20 for safety),
      pg = max(-A·ratio, -A·clip(ratio, 1 - clip_low, 1 + clip_high)).
    TIS (truncated importance sampling, as the reference's spade_tis for stale Designer
    samples): with `behaviour_logp` (the sampler's log-prob) and `tis_cap`, pg is multiplied by
    the constant weight min(exp(old_logp - behaviour_logp), tis_cap); old_logp is then the
    log-prob under the policy at the start of this update.
    KL (off unless kl_coef > 0): the low-variance estimator exp(r) - r - 1, r = ref_logp - logp.
    Returns (loss_sum, token_count, metric sums); divide sums by token_count for means.
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
    if tis_cap is not None and behaviour_logp is not None:
        weight = jnp.minimum(jnp.exp(old_logp - behaviour_logp), tis_cap)
        per_token = per_token * jax.lax.stop_gradient(weight)
    metrics = {
        "clip_fraction": jnp.sum((clipped > unclipped) * mask),
        "ratio": jnp.sum(ratio * mask),
        "approx_kl": jnp.sum(0.5 * jnp.square(log_ratio) * mask),
    }
    if kl_coef and ref_logp is not None:
        r = ref_logp - logp
        kl = jnp.exp(r) - r - 1.0
        per_token = per_token + kl_coef * kl
        metrics["kl"] = jnp.sum(kl * mask)
    return jnp.sum(per_token * mask), jnp.sum(mask), metrics
