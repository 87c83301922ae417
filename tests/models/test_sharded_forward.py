"""On 8 fake CPU devices, sharded forward passes equal the single-device one; specs are honoured."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from spade_jax.policy import Policy
from spade_jax.sharding import fit_spec, make_mesh
from spade_jax.weights import load_hf_model
from spade_jax.weights.tiny import write_tiny_checkpoint

pytest.importorskip("torch")
MESHES = [(1, 8, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module", params=["llama", "qwen3_moe"])
def checkpoint(request, tmp_path_factory):
    return write_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def tokens():
    return np.random.RandomState(0).randint(0, 128, (8, 12))


@pytest.fixture(scope="module")
def single_device_logits(checkpoint, tokens):
    model = load_hf_model(checkpoint)
    return np.asarray(Policy(model, None, make_mesh((1, 1, 1), jax.devices()[:1])).logits(tokens))


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_equals_single_device(checkpoint, tokens, single_device_logits, shape):
    assert len(jax.devices()) == 8, "tests/conftest.py must fake 8 CPU devices"
    mesh = make_mesh(shape)
    model = load_hf_model(checkpoint, mesh=mesh)
    for name, variable in vars(model).items():
        if not hasattr(variable, "get_metadata"):
            continue
        value = variable[...]
        spec = fit_spec(variable.get_metadata()["out_sharding"], value.shape, mesh)
        assert value.sharding == NamedSharding(mesh, spec), name
    logits = np.asarray(Policy(model, None, mesh).logits(tokens))
    np.testing.assert_allclose(logits, single_device_logits, atol=1e-5, rtol=0)


def test_query_chunked_attention_is_exact_in_value_and_gradient():
    import jax
    import jax.numpy as jnp

    from spade_jax.models import layers

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    length = 300
    q = jax.random.normal(k1, (2, length, 6, 16))
    k = jax.random.normal(k2, (2, 2, 16, length))  # keys transposed: [B, K, Dh, S]
    v = jax.random.normal(k3, (2, 2, length, 16))  # [B, K, S, Dh]
    mask = jnp.tril(jnp.ones((length, length), bool))[None].repeat(2, 0)
    full = lambda q: layers.attention(q, k, v, mask, query_chunk=4096)  # noqa: E731
    chunked = lambda q: layers.attention(q, k, v, mask, query_chunk=128)  # noqa: E731
    assert jnp.abs(full(q) - chunked(q)).max() < 1e-5
    grad_full = jax.grad(lambda q: full(q).sum())(q)
    grad_chunked = jax.grad(lambda q: chunked(q).sum())(q)
    assert jnp.abs(grad_full - grad_chunked).max() < 1e-5
    # causal blocks (64 queries, the last 44) skipping the keys after each block; chunked inside
    for chunk in (4096, 16):
        def blocked(q, chunk=chunk):
            return layers.attention(q, k, v, mask, query_chunk=chunk, causal=True)
        assert jnp.abs(full(q) - blocked(q)).max() < 1e-5
        assert jnp.abs(grad_full - jax.grad(lambda q, f=blocked: f(q).sum())(q)).max() < 1e-5
    with pytest.raises(ValueError, match="as many keys as queries"):
        layers.attention(q[:, :10], k, v, mask[:, :10], causal=True)


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_attention_equals_a_numpy_reference(batch):
    """One query per row over transposed cached keys (a decode step) is exact GQA attention."""
    import jax.numpy as jnp

    from spade_jax.models import layers

    rng = np.random.default_rng(batch)
    n_kv, group, slots, head_dim = 2, 3, 40, 8
    q = rng.standard_normal((batch, 1, n_kv * group, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch, n_kv, slots, head_dim)).astype(np.float32)
    v = rng.standard_normal((batch, n_kv, slots, head_dim)).astype(np.float32)
    mask = rng.random((batch, 1, slots)) > 0.3
    out = np.asarray(layers.attention(jnp.asarray(q), jnp.asarray(k).swapaxes(-1, -2),
                                      jnp.asarray(v), jnp.asarray(mask)))
    expected = np.zeros_like(q)
    for b in range(batch):
        for h in range(n_kv * group):
            kv = h // group
            scores = k[b, kv] @ q[b, 0, h] / np.sqrt(head_dim)
            scores = np.where(mask[b, 0], scores, -np.inf)
            probs = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            expected[b, 0, h] = probs @ v[b, kv]
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=0)
