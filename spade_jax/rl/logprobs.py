"""Per-token log-probabilities from hidden states, in sequence chunks.

The full [B, T, vocab] logits never exist: a `lax.scan` over chunks of `chunk_size` positions
computes each chunk's float32 logits, keeps only the target token's log-probability and, under
`jax.checkpoint`, recomputes the chunk in the backward pass instead of storing it (at 152k vocab,
64k tokens of float32 logits would take 39 GB).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spade_jax.models.layers import vocab_logits
from spade_jax.models.transformer import ROWS_SPLIT, Transformer, positions_from_mask
from spade_jax.sharding import BATCH_AXES, constrain


def chunked_target_logprobs(
    hidden: jax.Array, weight: jax.Array, targets: jax.Array, chunk_size: int = 256, *,
    vocab_major: bool = False,
) -> jax.Array:
    """log softmax(logits)[targets] for hidden [B, T, D], targets [B, T] -> [B, T].

    Logits are `layers.vocab_logits(hidden, weight, vocab_major)`: weight [D, V], or [V, D]
    with vocab_major (a tied embedding as stored).
    """
    batch, length, d_model = hidden.shape
    chunk_size = min(chunk_size, length)
    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hidden = hidden.reshape(batch, n_chunks, chunk_size, d_model).swapaxes(0, 1)
    targets = targets.reshape(batch, n_chunks, chunk_size).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_logprobs(h, t):
        h = constrain(h, ROWS_SPLIT)
        logits = constrain(vocab_logits(h, weight, vocab_major), (BATCH_AXES, None, "tensor"))
        target = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return target - jax.nn.logsumexp(logits, axis=-1)

    _, logp = jax.lax.scan(lambda c, xs: (c, chunk_logprobs(*xs)), None, (hidden, targets))
    return logp.swapaxes(0, 1).reshape(batch, n_chunks * chunk_size)[:, :length]


def token_logprobs(
    model: Transformer,
    tokens: jax.Array,
    mask: jax.Array | None = None,
    *,
    chunk_size: int = 256,
    remat: bool = False,
    compute_dtype=None,
    record_router_load: bool = False,
) -> jax.Array:
    """logp [B, T] with logp[:, t] = log p(tokens[:, t] | tokens[:, :t]) and logp[:, 0] = 0.

    `mask` [B, T] marks real tokens (left or right padding). The decoder runs in
    `compute_dtype` (None: the weights' dtype); logits and softmax are float32 whatever it is.
    This alignment is the one `Session.training_arrays` uses for its policy_logp.
    `record_router_load`: see `Transformer.__call__`.
    """
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    hidden = model(tokens, positions_from_mask(mask), kv_mask=mask, remat=remat,
                   compute_dtype=compute_dtype, record_router_load=record_router_load)
    weight, vocab_major = model.output_projection()
    logp = chunked_target_logprobs(hidden[:, :-1], weight, tokens[:, 1:], chunk_size,
                                   vocab_major=vocab_major)
    return jnp.pad(logp, ((0, 0), (1, 0)))
