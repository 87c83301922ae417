"""Pure building blocks of the decoder: norm, rotary embedding, MLP, mixture of experts.

Every function here is a plain function of arrays so the transformer can `lax.scan` over stacked
layer parameters. Norms, softmax and the router run in float32 whatever the compute dtype.
Attention and its kernels are in `attention.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts sharding (Qwen3-30B-A3B: 128 experts, top-8, expert FFN 768)
#
# Parameters (see Transformer.__init__). The experts of a layer are stacked on a leading axis:
#   w_gate, w_up  [L, E, D, F]  spec (None, 'tensor', 'fsdp', None)
#   w_down        [L, E, F, D]  spec (None, 'tensor', None, 'fsdp')
#   router        [L, D, E]     spec (None, 'fsdp', None)   (replicated over 'tensor')
# so the 'tensor' axis doubles as the expert axis: with tensor=8 each device owns E/8 = 16
# whole experts, and their D dimension is further split over 'fsdp' (ZeRO-3 style: gathered
# just in time for the matmul, gradients reduce-scattered back).
#
# What runs today: `moe_mlp_dense` below. Tokens x [B, T, D] are sharded over ('data',
# 'fsdp') and replicated over 'tensor'. Each device runs *its* E/tp experts on *all* of its
# local tokens ([B/dp, T, E/tp, F] hidden), scales every expert's output by the router weight
# (zero outside a token's top-k) and sums over its local experts; the sum over the 'tensor'
# axis is then one all-reduce (or reduce-scatter) of [B/dp, T, D] per layer, inserted by
# XLA's SPMD partitioner. No token moves between devices, the result is exact, but each
# device does E/k = 16x the FLOPs a routed kernel needs (all 16 local experts instead of the
# ~1 of them a token actually picks on average), and the [B/dp, T, E/tp, F] intermediate
# dominates the activation memory (spade_jax/plan.py counts the routed top-k width instead;
# `python -m spade_jax.readiness` shows what the dense fallback really compiles to).
#
# What a routed kernel would do (NOT implemented; it is the TPU/GPU speed path), inside a
# `shard_map` over the mesh with the expert axis manual:
#   1. route locally: top-k experts and weights per token ([N, k], N local tokens);
#   2. split the N tokens evenly over the 'tensor' ranks (they hold the same tokens), flatten
#      to N/tp*k token copies and sort them by expert id; count copies per expert;
#   3. exchange the counts with an `all_to_all` over 'tensor', then send every copy to the rank
#      that owns its expert with `jax.lax.ragged_all_to_all` over 'tensor' (dropless: sizes
#      come from the counts, no capacity factor);
#   4. on each rank run its E/tp experts as one grouped matmul (`jax.lax.ragged_dot`, or the
#      megablox GMM Pallas kernel on TPU) over the received copies grouped by expert;
#   5. a second `ragged_all_to_all` returns the outputs to the copies' home ranks; un-sort,
#      scale by the router weights, sum the k copies of each token, and all-gather the
#      token split of step 2 over 'tensor'.
# Communication per layer is then two ragged all-to-alls of ~N*k/tp rows of D instead of one
# all-reduce of N rows, and the expert FLOPs drop by E/k.
# ---------------------------------------------------------------------------------------------
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
