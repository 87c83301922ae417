"""The hand-written backward passes of the decoder's layers equal autodiff of the plain maths."""

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.models import layers


def _close(actual, expected, tol=2e-5):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e)))
        assert scale > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=tol * scale, rtol=0)


def _plain_swiglu(x, gate, up, down):
    return (jax.nn.silu(x @ gate) * (x @ up)) @ down


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
