"""The hand-written backward passes of the decoder's layers equal autodiff of the plain maths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import layers


def _close(actual, expected, tol=2e-5):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e)))
        assert scale > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=tol * scale, rtol=0)


def _plain_swiglu(x, gate, up, down):
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


def _plain_attention(q, k_t, v, mask):
    """GQA attention with the KV heads repeated, autodiff-only (no custom VJP)."""
    batch, length, n_heads, head_dim = q.shape
    group = n_heads // k_t.shape[1]
    k = jnp.repeat(k_t.swapaxes(-1, -2), group, axis=1)  # [B, H, S, Dh]
    v = jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("bthd,bhsd->bhts", q, k) / jnp.sqrt(head_dim)
    scores = jnp.where(mask[:, None], scores, layers.MASK_VALUE)
    return jnp.einsum("bhts,bhsd->bthd", jax.nn.softmax(scores, axis=-1), v)


def test_swiglu_backward_equals_autodiff():
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (3, 5, 16))
    gate, up = (0.3 * jax.random.normal(k, (16, 24)) for k in keys[1:3])
    down = 0.3 * jax.random.normal(keys[3], (24, 16))
    cotangent = jax.random.normal(keys[4], (3, 5, 16))
    args = (x, gate, up, down)
    out, vjp = jax.vjp(layers.swiglu_mlp, *args)
    expected_out, expected_vjp = jax.vjp(_plain_swiglu, *args)
    _close(out, expected_out)
    _close(vjp(cotangent), expected_vjp(cotangent))


@pytest.mark.parametrize(("query_chunk", "causal_blocks"), [
    (512, False), (4, False),  # one block, and query-chunked blocks
    (512, True), (2, True),  # causal blocks of 3 queries (the last one 3 too), chunked inside
])
def test_attention_backward_equals_autodiff(query_chunk, causal_blocks, monkeypatch):
    """Causal attention over left-padded rows, including fully masked (padding) query rows."""
    monkeypatch.setattr(layers, "CAUSAL_MIN_BLOCK", 3)
    keys = jax.random.split(jax.random.key(1), 4)
    batch, length, n_heads, n_kv, head_dim = 2, 9, 6, 2, 8
    q = jax.random.normal(keys[0], (batch, length, n_heads, head_dim))
    k_t = jax.random.normal(keys[1], (batch, n_kv, head_dim, length))
    v = jax.random.normal(keys[2], (batch, n_kv, length, head_dim))
    real = jnp.ones((batch, length), bool).at[1, :3].set(False)  # row 1 left-padded by 3
    causal = jnp.tril(jnp.ones((length, length), bool))
    mask = causal[None] & real[:, None, :]
    assert not bool(mask[1, 0].any())  # a query row that sees nothing
    cotangent = jax.random.normal(keys[3], q.shape)
    if causal_blocks:
        # A query that sees no key has no defined output (uniform weights over whichever keys
        # its block holds); in training such rows are padding and get no gradient.
        sees = mask.any(-1)[:, :, None, None]
        cotangent = jnp.where(sees, cotangent, 0.0)
    else:
        sees = jnp.ones((batch, length, 1, 1), bool)
    ours = lambda q, k_t, v: layers.attention(q, k_t, v, mask, query_chunk,  # noqa: E731
                                              causal=causal_blocks)
    plain = lambda q, k_t, v: _plain_attention(q, k_t, v, mask)  # noqa: E731
    out, vjp = jax.vjp(ours, q, k_t, v)
    expected_out, expected_vjp = jax.vjp(plain, q, k_t, v)
    _close(jnp.where(sees, out, 0.0), jnp.where(sees, expected_out, 0.0))
    _close(vjp(cotangent), expected_vjp(cotangent))
