"""Pure building blocks of the decoder: norm, rotary embedding, attention, MLP, mixture of experts.

Every function here is a plain function of arrays so the transformer can `lax.scan` over stacked
layer parameters. Norms, softmax and the router run in float32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MASK_VALUE = -2.3819763e38  # large negative that stays finite in float32 and bfloat16


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32 and cast back to the input dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding in the rotate-half convention of HF Llama/Qwen (x: [B, T, H, Dh])."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


ATTENTION_QUERY_CHUNK = 512


def _attention_block(q, k, v, mask):
    """Exact GQA attention of one block of queries. q: [B, C, K, G, Dh]; mask [B, C, S]."""
    head_dim = q.shape[-1]
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (head_dim**-0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
    query_chunk: int = ATTENTION_QUERY_CHUNK,
) -> jax.Array:
    """Grouped-query attention without repeating KV heads.

    q: [B, T, H, Dh]; k, v: [B, S, K, Dh] with H a multiple of K; mask: [B, T, S] bool
    (True = may attend). Returns [B, T, H, Dh]. Long query blocks are processed `query_chunk`
    queries at a time (each chunk rematerialised in the backward pass), so the float32 score
    matrix held at once is [B, H, chunk, S] instead of [B, H, T, S]: exact, and the difference
    between minutes and seconds for a 4k-token CPU prefill and between GiB and TiB at 32k.
    """
    batch, q_len, n_heads, head_dim = q.shape
    n_kv = k.shape[2]
    q = q.reshape(batch, q_len, n_kv, n_heads // n_kv, head_dim)
    if q_len <= query_chunk:
        out = _attention_block(q, k, v, mask)
        return out.reshape(batch, q_len, n_heads, head_dim)
    n_chunks = -(-q_len // query_chunk)
    pad = n_chunks * query_chunk - q_len
    q = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
    q_chunks = jnp.moveaxis(q.reshape(batch, n_chunks, query_chunk, *q.shape[2:]), 1, 0)
    m_chunks = jnp.moveaxis(mask.reshape(batch, n_chunks, query_chunk, mask.shape[-1]), 1, 0)
    block = jax.checkpoint(lambda qm: _attention_block(qm[0], k, v, qm[1]))
    out = jax.lax.map(block, (q_chunks, m_chunks))  # [n_chunks, B, C, K, G, Dh]
    out = jnp.moveaxis(out, 0, 1).reshape(batch, n_chunks * query_chunk, n_heads, head_dim)
    return out[:, :q_len]


def swiglu_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """SwiGLU feed-forward: down(silu(x @ gate) * (x @ up))."""
    hidden = jax.nn.silu(x @ gate) * (x @ up)
    return hidden @ down


def router_weights(
    x: jax.Array, router: jax.Array, top_k: int, normalise: bool
) -> jax.Array:
    """Qwen3-MoE routing: softmax over experts, keep the top-k, optionally renormalise.

    Returns dense per-expert weights [..., E] that are zero outside each token's top-k.
    """
    logits = (x @ router).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    top_vals, top_idx = jax.lax.top_k(probs, top_k)
    if normalise:
        top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
    one_hot = jax.nn.one_hot(top_idx, probs.shape[-1], dtype=jnp.float32)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", top_vals, one_hot)


def moe_mlp_dense(
    x: jax.Array,
    router: jax.Array,
    gate: jax.Array,
    up: jax.Array,
    down: jax.Array,
    top_k: int,
    normalise: bool,
) -> jax.Array:
    """Mixture of experts, dense fallback: every expert runs on every token, weighted by routing.

    Exact (equal to a routed implementation) and shardable over the expert axis: with the
    expert weights [E, D, F] sharded on E, each device computes its experts and the weighted
    sum becomes a reduce-scatter/all-reduce over that axis. It costs E/top_k times the FLOPs of
    a routed kernel, which is fine for tests and CPU runs; large runs want a ragged kernel.
    """
    weights = router_weights(x, router, top_k, normalise).astype(x.dtype)  # [B, T, E]
    hidden = jax.nn.silu(jnp.einsum("btd,edf->btef", x, gate)) * jnp.einsum(
        "btd,edf->btef", x, up
    )
    expert_out = jnp.einsum("btef,efd->bted", hidden, down)
    return jnp.einsum("bted,bte->btd", expert_out, weights)
