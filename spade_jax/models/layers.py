"""Pure building blocks of the decoder: norm, rotary embedding, MLP.

Every function here is a plain function of arrays so the transformer can `lax.scan` over stacked
layer parameters. Norms and softmax run in float32 whatever the compute dtype. Attention and its
kernels are in `attention.py`, the mixture of experts in `moe.py`.
"""

from __future__ import annotations

import dataclasses
from functools import partial

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


@partial(jax.tree_util.register_dataclass, data_fields=["weight"], meta_fields=["out_major"])
@dataclasses.dataclass(frozen=True)
class Projection:
    """A 2-D weight matrix held [in, out] or, `out_major`, [out, in]. The orientation is static,
    so a program compiles for the one it holds: the sampler's CPU copy of the weights holds the
    one its decode's dot path reads fastest (`sampling.DecodeDots.out_major`)."""

    weight: jax.Array
    out_major: bool

    def __call__(self, x: jax.Array, preferred_element_type=None) -> jax.Array:
        """x [..., in] times the matrix: [..., out]."""
        spec = "...i,oi->...o" if self.out_major else "...i,io->...o"
        return jnp.einsum(spec, x, self.weight.astype(x.dtype),
                          preferred_element_type=preferred_element_type)


def vocab_logits(hidden: jax.Array, weight: jax.Array, vocab_major: bool) -> jax.Array:
    """Float32 logits [..., V] of hidden [..., D] against weight [V, D] (vocab_major) or [D, V]."""
    return Projection(weight, vocab_major)(hidden, jnp.float32)


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
