"""Pure building blocks of the decoder: norm, rotary embedding, attention, MLP.

Every function here is a plain function of arrays so the transformer can `lax.scan` over stacked
layer parameters. Norms and softmax run in float32 whatever the compute dtype. The mixture of
experts is in `spade_jax.models.moe`.
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


def vocab_logits(hidden: jax.Array, weight: jax.Array, vocab_major: bool) -> jax.Array:
    """Float32 logits [..., V] of hidden [..., D] against weight [V, D] (vocab_major) or [D, V]."""
    spec = "...d,vd->...v" if vocab_major else "...d,dv->...v"
    return jnp.einsum(spec, hidden, weight.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)


ATTENTION_QUERY_CHUNK = 512


def _gqa_scores(q: jax.Array, k_t: jax.Array, mask: jax.Array) -> jax.Array:
    """Scaled, masked float32 scores [B, K, G, C, S] of q [B, K, G, C, Dh] against k_t."""
    batch, n_kv, group, length, head_dim = q.shape
    rows = q.reshape(batch, n_kv, group * length, head_dim)
    scores = jnp.matmul(rows, k_t, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, n_kv, group, length, -1) * (head_dim**-0.5)
    return jnp.where(mask[:, None, None], scores, MASK_VALUE)


def _attention_block_forward(q, k_t, v, mask):
    batch, n_kv, group, length, head_dim = q.shape
    scores = _gqa_scores(q, k_t, mask)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    exp = jnp.exp(scores - row_max)
    row_sum = jnp.sum(exp, axis=-1, keepdims=True)
    probs = (exp / row_sum).astype(v.dtype)
    out = jnp.matmul(probs.reshape(batch, n_kv, group * length, -1), v)
    out = out.reshape(batch, n_kv, group, length, head_dim)
    return out, (q, k_t, v, mask, out, row_max, row_sum)


@jax.custom_vjp
def _attention_block(q: jax.Array, k_t: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Exact GQA attention of one block of queries, as two batched matmuls over (B, K).

    q: [B, K, G, C, Dh]; k_t: [B, K, Dh, S]; v: [B, K, S, Dh]; mask: [B, C, S].
    Returns [B, K, G, C, Dh]. The G query heads of a KV head are stacked on the row axis
    ([G*C, Dh] @ [Dh, S]), the layout XLA-CPU runs as plain GEMMs (several times faster than
    the 5-axis einsum).
    The backward pass (`_attention_block_backward`) keeps only the softmax's row max and sum
    and recomputes the probabilities, as flash attention does, instead of autodiff's stored
    [B, H, C, S] scores and probabilities: for SmolLM2 at 8 x 256 tokens that is 38 MB less
    written and read per layer, and in a layer scan it also spares zero-filling the stacked
    buffers.
    """
    return _attention_block_forward(q, k_t, v, mask)[0]


def _attention_block_backward(residuals, d_out):
    q, k_t, v, mask, out, row_max, row_sum = residuals
    batch, n_kv, group, length, head_dim = q.shape
    rows = lambda a: a.reshape(batch, n_kv, group * length, -1)  # noqa: E731
    probs = jnp.exp(_gqa_scores(q, k_t, mask) - row_max) / row_sum
    d_out_rows = rows(d_out)
    d_v = jnp.matmul(rows(probs).astype(v.dtype).swapaxes(-1, -2), d_out_rows)
    d_probs = jnp.matmul(d_out_rows, v.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    # softmax backward: p * (dp - sum(p * dp)), with sum(p * dp) = sum(d_out * out) per row
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scores = probs * (d_probs.reshape(probs.shape) - delta)
    d_scores = jnp.where(mask[:, None, None], d_scores, 0.0) * (head_dim**-0.5)
    d_scores = rows(d_scores).astype(q.dtype)
    d_q = jnp.matmul(d_scores, k_t.swapaxes(-1, -2)).reshape(q.shape)
    d_k_t = jnp.matmul(rows(q).swapaxes(-1, -2), d_scores)
    return d_q, d_k_t, d_v, None


_attention_block.defvjp(_attention_block_forward, _attention_block_backward)


CAUSAL_BLOCKS = 8  # at most this many causal query blocks per layer (unrolled in its program)
CAUSAL_MIN_BLOCK = 64  # smaller blocks cost more in matmul efficiency than their skipped keys


def attention(
    q: jax.Array, k_t: jax.Array, v: jax.Array, mask: jax.Array,
    query_chunk: int = ATTENTION_QUERY_CHUNK, *, causal: bool = False,
) -> jax.Array:
    """Grouped-query attention without repeating KV heads.

    q: [B, T, H, Dh]; k_t: [B, K, Dh, S] (keys transposed) and v: [B, K, S, Dh] (the KV-cache
    layout) with H a multiple of K; mask: [B, T, S] bool (True = may attend). Returns
    [B, T, H, Dh].
    `causal=True` promises that S == T and that `mask` hides every key after its query (the
    no-cache training forward). The queries are then taken in up to `CAUSAL_BLOCKS` blocks,
    each against only the keys up to its last query, which skips the masked upper triangle.
    Long query blocks are processed `query_chunk` queries at a time (each chunk
    rematerialised in the backward pass), so the float32 score matrix held at once is
    [B, H, chunk, S] instead of [B, H, T, S]: exact, with memory linear rather than quadratic
    in T. Keys come transposed, the layout the score matmul reads (a faster decode step).
    """
    batch, q_len, n_heads, head_dim = q.shape
    n_kv = k_t.shape[1]
    q = q.reshape(batch, q_len, n_kv, n_heads // n_kv, head_dim).transpose(0, 2, 3, 1, 4)
    if causal:
        if q_len != k_t.shape[-1]:
            raise ValueError(f"causal attention needs as many keys as queries, got "
                             f"{k_t.shape[-1]} keys for {q_len} queries")
        block = max(CAUSAL_MIN_BLOCK, -(-q_len // CAUSAL_BLOCKS))
        outs = []
        for start in range(0, q_len, block):
            end = min(start + block, q_len)  # the block's last query sees keys [0, end)
            outs.append(_chunked_attention(q[:, :, :, start:end], k_t[..., :end],
                                           v[:, :, :end], mask[:, start:end, :end], query_chunk))
        out = jnp.concatenate(outs, axis=3)
    else:
        out = _chunked_attention(q, k_t, v, mask, query_chunk)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, n_heads, head_dim)


def _chunked_attention(q, k_t, v, mask, query_chunk):
    """`_attention_block` over q [B, K, G, C, Dh], `query_chunk` queries at a time."""
    q_len, head_dim = q.shape[3], q.shape[4]
    if q_len <= query_chunk:
        return _attention_block(q, k_t, v, mask)
    n_chunks = -(-q_len // query_chunk)
    pad = n_chunks * query_chunk - q_len
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
    q_chunks = jnp.moveaxis(q.reshape(*q.shape[:3], n_chunks, query_chunk, head_dim), 3, 0)
    m_chunks = jnp.moveaxis(mask.reshape(mask.shape[0], n_chunks, query_chunk, -1), 1, 0)
    block = jax.checkpoint(lambda qm: _attention_block(qm[0], k_t, v, qm[1]))
    out = jax.lax.map(block, (q_chunks, m_chunks))  # [n_chunks, B, K, G, C, Dh]
    out = jnp.moveaxis(out, 0, 3).reshape(*q.shape[:3], n_chunks * query_chunk, head_dim)
    return out[:, :, :, :q_len]


@jax.custom_vjp
def swiglu_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """SwiGLU feed-forward: down(silu(x @ gate) * (x @ up)), x [..., D].

    The backward pass is written out (`_swiglu_backward`) rather than left to autodiff: XLA-CPU
    fused autodiff's SiLU-derivative and gating products into transposed [F, tokens] copies for
    the weight-gradient matmuls, which is slower than doing the elementwise work in token-major
    layout.
    """
    return _swiglu_forward(x, gate, up, down)[0]


def _swiglu_forward(x, gate, up, down):
    g, u = x @ gate, x @ up
    return (jax.nn.silu(g) * u) @ down, (x, g, u, gate, up, down)


def _token_contraction(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [N, P], b [N, Q] -> a^T b [P, Q]: a weight gradient, summed over the N tokens."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())))


def _swiglu_backward(residuals, d_out):
    x, g, u, gate, up, down = residuals
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731  [..., C] -> [tokens, C]
    x2, g, u, d_out2 = flat(x), flat(g), flat(u), flat(d_out)
    sig = jax.nn.sigmoid(g)
    silu = g * sig
    d_hidden = d_out2 @ down.T
    d_up = d_hidden * silu
    d_gate = d_hidden * u * (sig * (1 + g * (1 - sig)))  # d silu(g) / dg = sig (1 + g (1 - sig))
    d_x = d_gate @ gate.T + d_up @ up.T
    return (d_x.reshape(x.shape), _token_contraction(x2, d_gate), _token_contraction(x2, d_up),
            _token_contraction(silu * u, d_out2))


swiglu_mlp.defvjp(_swiglu_forward, _swiglu_backward)
