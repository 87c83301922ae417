"""Chunked log-probs equal the full-logits log-softmax, for any chunk size and padding."""

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer, forward_logits
from spade_jax.rl.logprobs import token_logprobs

CFG = ModelConfig(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  ffn_dim=48)


def test_chunked_logprobs_match_full_logits():
    model = Transformer(CFG, rngs=nnx.Rngs(1))
    tokens = jax.random.randint(jax.random.key(0), (3, 11), 0, 53)
    mask = jnp.ones((3, 11), bool).at[1, 8:].set(False)  # right padding
    full = jax.nn.log_softmax(forward_logits(model, tokens, mask), axis=-1)
    expected = jnp.take_along_axis(full[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    for chunk in (1, 4, 7, 64):
        logp = token_logprobs(model, tokens, mask, chunk_size=chunk)
        assert logp.shape == (3, 11) and np.all(np.asarray(logp[:, 0]) == 0)
        np.testing.assert_allclose(logp[:, 1:], expected, atol=1e-5)
    remat = token_logprobs(model, tokens, mask, chunk_size=4, remat=True)
    np.testing.assert_allclose(remat[:, 1:], expected, atol=1e-5)
