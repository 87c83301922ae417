"""Next-token selection: greedy, temperature, top-k then top-p, without a full-vocabulary sort.

All knobs are traced scalars, so changing them never recompiles:
- temperature == 0 selects greedy (argmax); the branch is a `lax.cond`, so greedy decoding
  pays for no random numbers.
- top-k (1 <= top_k <= max_top_k) keeps the top_k largest logits of a fixed candidate set
  taken once with `lax.top_k(logits, max_top_k)`; top_k = 0 means no top-k.
- top-p (nucleus) keeps the smallest set of most likely tokens whose probability reaches top_p,
  computed on the distribution left after temperature and top-k (renormalised), as in HF.
  With top-k on, this is a cumulative sum over the sorted candidates. With top-k off the nucleus
  can be larger than the candidate set: when the candidates already hold top_p of the mass for
  every row it is taken from them (exact); otherwise, for the rows whose candidates miss it, a
  bisection on a probability threshold over the full vocabulary finds the smallest kept set
  (exact up to ties and 30 halvings of the threshold in log space) — O(vocab) per halving and
  row, never a sort.
- among candidates, sampling is Gumbel-max: a token's noise is a hash (Threefry) of its row's
  key and its vocabulary index, computed for the candidates only. Over the whole vocabulary
  (plain sampling, and the rows of the bisection path whose nucleus outgrows their
  candidates) each row's cumulative distribution is inverted at one uniform draw
  (`_sample_inverse_cdf`) instead of hashing noise for every vocabulary entry. Which path the
  batch takes never changes a row's token: on the bisection path a row whose nucleus fits its
  candidates still samples them with their noise, and whether it fits depends on that row
  alone.

Two log-probabilities come back for each chosen token:
- `policy_logp`: log-softmax of the raw logits (temperature 1, no truncation), the quantity the
  train step's forward computes (as the reference's Slime with --rollout-temperature 1). It is
  the `behaviour_logp` of the train step's TIS weight exp(train logp - behaviour_logp), which
  corrects for sampler/trainer numerics (bf16 copy, KV cache) and for stale samples.
- `sampling_logp`: log-probability under the distribution actually sampled from (temperature,
  top-k, top-p applied; 0 for greedy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

DEFAULT_MAX_TOP_K = 64
_BISECTION_STEPS = 30
_NEG_INF = -jnp.inf


def first_argmax(values: jax.Array, row_max: jax.Array | None = None) -> jax.Array:
    """Index of the first maximum along the last axis (int32), like `jnp.argmax`.

    As a max, a compare and a min rather than XLA's variadic (value, index) reduction, which is
    several times slower on CPU over a large vocabulary, on every decode step. `row_max`: the
    max along the last axis (keepdims) where the caller already has it. A row without a
    maximum (NaN logits) gives the last index.
    """
    size = values.shape[-1]
    if row_max is None:
        row_max = jnp.max(values, axis=-1, keepdims=True)
    is_max = values == row_max
    first = jnp.min(jnp.where(is_max, jnp.arange(size, dtype=jnp.int32), size), axis=-1)
    return jnp.minimum(first, size - 1)


def _nucleus_threshold_bisect(log_probs: jax.Array, top_p: jax.Array) -> jax.Array:
    """Per row, the largest log-probability threshold whose kept mass (p >= threshold) >= top_p."""
    low = jnp.min(log_probs, axis=-1)  # keeps everything: mass 1 >= top_p
    high = jnp.max(log_probs, axis=-1)  # keeps the argmax only

    def halve(_, bounds):
        low, high = bounds
        mid = 0.5 * (low + high)
        kept = jnp.sum(jnp.where(log_probs >= mid[:, None], jnp.exp(log_probs), 0.0), axis=-1)
        enough = kept >= top_p
        return jnp.where(enough, mid, low), jnp.where(enough, high, mid)

    low, high = jax.lax.fori_loop(0, _BISECTION_STEPS, halve, (low, high))
    top_mass = jnp.sum(jnp.where(log_probs >= high[:, None], jnp.exp(log_probs), 0.0), axis=-1)
    return jnp.where(top_mass >= top_p, high, low)


def gumbel_noise(keys: jax.Array, indices: jax.Array) -> jax.Array:
    """Gumbel(0, 1) noise [B, n] at vocabulary `indices` [B, n] for rows with PRNG `keys` [B].

    Each value is a function of its row's key and its index only (one Threefry-2x32 block per
    value), so a token's noise does not depend on its rank among the candidates, nor on how
    many candidates are drawn (`max_top_k`).
    """
    words = jax.vmap(lambda key: jax.random.bits(key, (2,), jnp.uint32))(keys)  # [B, 2]
    counters = indices.astype(jnp.uint32)
    k0 = jnp.broadcast_to(words[:, :1], counters.shape)
    k1 = jnp.broadcast_to(words[:, 1:], counters.shape)
    bits, _ = threefry2x32_p.bind(k0, k1, counters, jnp.zeros_like(counters))
    # 23 random mantissa bits: uniform on [0, 1), then kept off 0 as jax.random.gumbel does.
    uniform = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    uniform = jnp.maximum(uniform, jnp.finfo(jnp.float32).tiny)
    return -jnp.log(-jnp.log(uniform))


def _sample_from_candidates(cand_vals, cand_idx, full_log_norm, keys, top_k, top_p):
    """Sample among the sorted top-`max_top_k` candidates after top-k and top-p masking.

    With top-k on, top-p sees the renormalised top-k distribution; with it off, the full one
    (normaliser `full_log_norm`), whose nucleus then lies inside the candidates.
    """
    ranks = jnp.arange(cand_vals.shape[-1])
    keep = (top_k <= 0) | (ranks < top_k)
    vals = jnp.where(keep[None, :], cand_vals, _NEG_INF)
    log_norm = jnp.where(top_k > 0, jax.nn.logsumexp(vals, axis=-1), full_log_norm)
    probs = jnp.exp(vals - log_norm[:, None])
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    vals = jnp.where(mass_before < top_p, vals, _NEG_INF)  # the first candidate always stays
    choice = jnp.argmax(vals + gumbel_noise(keys, cand_idx), axis=-1)
    chosen = jnp.take_along_axis(cand_idx, choice[:, None], axis=-1)[:, 0]
    logp = jnp.take_along_axis(vals, choice[:, None], axis=-1)[:, 0] - jax.nn.logsumexp(
        vals, axis=-1
    )
    return chosen, logp


_NUCLEUS_ROWS = 8  # rows per pass of the nucleus bisection over the whole vocabulary


def _sample_full_vocab(scaled, cand_vals, cand_idx, full_log_norm, inside, keys, top_p):
    """Top-p alone, in a batch where some row's candidates miss top_p of the mass.

    A row whose nucleus lies `inside` its candidates samples exactly as the candidate path would
    (the same noise), so its token does not depend on the other rows. The others, gathered
    `_NUCLEUS_ROWS` at a time, find their nucleus by bisection over the whole vocabulary and
    invert its cumulative distribution at one uniform draw (`_sample_inverse_cdf`), with no
    noise for every vocabulary entry: the cost follows the rows outside, rare for a language
    model at the usual top-p, not the batch (a step verifying 4 drafts samples 5 per row).
    """
    tokens, logp = _sample_from_candidates(cand_vals, cand_idx, full_log_norm, keys,
                                           jnp.int32(0), top_p)
    batch = scaled.shape[0]
    chunk = min(_NUCLEUS_ROWS, batch)
    # the rows outside their candidates, then `batch` (no row: its results are dropped)
    outside = jnp.nonzero(~inside, size=batch + chunk, fill_value=batch)[0]

    def bisect_rows(state):
        start, tokens, logp = state
        rows = jax.lax.dynamic_slice(outside, (start,), (chunk,))
        read = jnp.minimum(rows, batch - 1)
        row_scaled = scaled[read]
        log_probs = row_scaled - full_log_norm[read][:, None]
        threshold = _nucleus_threshold_bisect(log_probs, top_p)
        nucleus = jnp.where(log_probs >= threshold[:, None], row_scaled, _NEG_INF)
        row_tokens, row_logp = _sample_inverse_cdf(nucleus, keys[read])
        return (start + chunk, tokens.at[rows].set(row_tokens, mode="drop"),
                logp.at[rows].set(row_logp, mode="drop"))

    _, tokens, logp = jax.lax.while_loop(lambda state: state[0] < jnp.sum(~inside),
                                         bisect_rows, (jnp.int32(0), tokens, logp))
    return tokens, logp


_CDF_BLOCK = 256  # vocabulary entries per block of the two-level cumulative sums


def _sample_inverse_cdf(scaled: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sample each row of softmax(`scaled`) [B, V] by inverting its cumulative distribution at
    one uniform draw per row; returns (tokens, their log-probabilities).

    Two levels, so no scan runs over the whole vocabulary: cumulative sums over blocks of
    `_CDF_BLOCK` entries pick the block, then over that block's entries. A token of probability
    0 is never picked: within the chosen block it is the first entry whose running sum passes
    the draw, or, where rounding leaves the draw past the block's sum, its last entry with
    mass.
    """
    batch, vocab = scaled.shape
    log_norm = jax.nn.logsumexp(scaled, axis=-1)
    probs = jnp.exp(scaled - log_norm[:, None])
    n_blocks = -(-vocab // _CDF_BLOCK)
    blocks = jnp.pad(probs, ((0, 0), (0, n_blocks * _CDF_BLOCK - vocab))).reshape(
        batch, n_blocks, _CDF_BLOCK)
    block_mass = jnp.sum(blocks, axis=-1)
    block_end = jnp.cumsum(block_mass, axis=-1)
    # 23 random bits: a draw in [0, 1) that stays below the total after the product rounds
    uniform = jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys)
    draw = uniform * block_end[:, -1]
    last_block_with_mass = n_blocks - 1 - jnp.argmax((block_mass > 0)[:, ::-1], axis=-1)
    block = jnp.minimum(jnp.sum(block_end <= draw[:, None], axis=-1), last_block_with_mass)
    entries = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]  # [B, block]
    before = jnp.take_along_axis(block_end - block_mass, block[:, None], axis=1)[:, 0]
    passed = jnp.cumsum(entries, axis=-1) <= (draw - before)[:, None]
    last_with_mass = _CDF_BLOCK - 1 - jnp.argmax((entries > 0)[:, ::-1], axis=-1)
    within = jnp.minimum(jnp.sum(passed, axis=-1), last_with_mass)
    tokens = (block * _CDF_BLOCK + within).astype(jnp.int32)
    logp = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - log_norm
    return tokens, logp


def select_tokens(
    logits: jax.Array,
    keys: jax.Array,
    *,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    max_top_k: int = DEFAULT_MAX_TOP_K,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Choose one token per row of float32 `logits` [B, V]; `keys` [B] are per-row PRNG keys.

    Returns (tokens [B] int32, policy_logp [B], sampling_logp [B]); see the module docstring.
    `top_k` above `max_top_k` (static) is clamped to it.
    """
    logits = logits.astype(jnp.float32)
    max_top_k = min(max_top_k, logits.shape[-1])
    top_k = jnp.minimum(jnp.asarray(top_k, jnp.int32), max_top_k)
    top_p = jnp.asarray(top_p, jnp.float32)

    # One max pass serves the greedy pick and the policy log-normaliser (as jax.nn.logsumexp
    # computes it); the greedy branch of the cond below would otherwise take its own.
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    shift = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    log_norm = shift[:, 0] + jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1))

    def greedy():
        return first_argmax(logits, row_max), jnp.zeros(logits.shape[:1], jnp.float32)

    def truncated(scaled):
        cand_vals, cand_idx = jax.lax.top_k(scaled, max_top_k)
        full_log_norm = jax.nn.logsumexp(scaled, axis=-1)
        inside = jnp.sum(jnp.exp(cand_vals - full_log_norm[:, None]), axis=-1) >= top_p
        use_candidates = (top_k > 0) | jnp.all(inside)
        # A row whose nucleus fits its candidates gets the same token on both paths, so a
        # row's sample never depends on the other rows.
        return jax.lax.cond(
            use_candidates,
            lambda: _sample_from_candidates(
                cand_vals, cand_idx, full_log_norm, keys, top_k, top_p
            ),
            lambda: _sample_full_vocab(scaled, cand_vals, cand_idx, full_log_norm, inside, keys,
                                       top_p),
        )

    def sample():
        scaled = logits / jnp.maximum(temperature, 1e-6)
        return jax.lax.cond((top_k > 0) | (top_p < 1.0), truncated,
                            lambda scaled: _sample_inverse_cdf(scaled, keys), scaled)

    tokens, sampling_logp = jax.lax.cond(temperature > 0, sample, greedy)
    tokens = tokens.astype(jnp.int32)
    policy_logp = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - log_norm
    return tokens, policy_logp, sampling_logp


def row_keys(seed: jax.Array, row_ids: jax.Array, positions: jax.Array) -> jax.Array:
    """One PRNG key per row from (seed, row id, position of the token being chosen).

    Keys depend on where the token sits in its conversation, not on padding, bucketing or on
    how many decode calls came before, so resampling a conversation reproduces it exactly.
    """
    base = jax.random.key(seed)
    return jax.vmap(lambda r, p: jax.random.fold_in(jax.random.fold_in(base, r), p))(
        row_ids, positions
    )
