"""Mixed precision: float32 master weights, moments and gradient sums under bf16 compute; the
sampler's own bf16 copy of the weights and bf16 KV cache, refreshed by set_params."""

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.trainer import (
    TrainConfig,
    TrainState,
    TrainStep,
    init_train_state,
    make_optimizer,
)
from spade_jax.sampling.sampler import Sampler
from spade_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                  ffn_dim=128)
LR = 1e-6  # the reference's learning rate


def mesh():
    return make_mesh((1, 1, 1), jax.devices()[:1])


def train_batch():
    """Every vocabulary id appears as an input, so every embedding row gets a gradient."""
    rng = np.random.default_rng(0)
    tokens = np.stack([rng.permutation(64) for _ in range(4)]).astype(np.int32)
    return dict(tokens=tokens, loss_mask=np.ones((4, 64), np.float32),
                advantages=rng.normal(size=4).astype(np.float32),
                behaviour_logp=np.full((4, 64), -4.0, np.float32))


def changed_fraction(state, optimizer, steps=10) -> float:
    """Share of master-weight entries that differ after `steps` lr-1e-6 steps, bf16 compute."""
    before = [np.asarray(x, np.float32) for x in jax.tree.leaves(jax.device_get(state.params))]
    step = TrainStep(CFG, optimizer, mesh(), TrainConfig(learning_rate=LR, tis_cap=None),
                     compute_dtype=jnp.bfloat16)
    for _ in range(steps):
        state, _ = step(state, train_batch())
    after = [np.asarray(x, np.float32) for x in jax.tree.leaves(jax.device_get(state.params))]
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
    return changed / sum(a.size for a in before)


def test_float32_masters_move_at_lr_1e6_under_bf16_compute():
    optimizer = make_optimizer(TrainConfig(learning_rate=LR))
    state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), optimizer, mesh())
    dtypes = {str(x.dtype) for x in jax.tree.leaves(state.opt_state) if x.ndim}
    assert dtypes == {"float32"}  # both Adam moments
    assert changed_fraction(state, optimizer) >= 0.99


def test_bf16_weights_the_old_choice_do_not_move():
    """The old set-up (bf16 weights updated in place, optax's default moment dtypes) fails the
    check above: most lr-1e-6 updates round away in an 8-bit mantissa."""
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(LR, b1=0.9, b2=0.98, weight_decay=0.1))
    model = Transformer(CFG, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    params = nnx.state(model)
    state = TrainState(params, optimizer.init(params), jnp.int32(0))
    assert changed_fraction(state, optimizer) < 0.5
    with pytest.raises(ValueError, match=r"float32 master weights .*\['bfloat16'\]"):
        init_train_state(model, optimizer, mesh())


def test_gradient_sums_are_float32_under_bf16_compute():
    optimizer = make_optimizer(TrainConfig())
    state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), optimizer, mesh())
    step = TrainStep(CFG, optimizer, mesh(), TrainConfig(), micro_batches=2,
                     compute_dtype=jnp.bfloat16)
    batch = step._to_device(train_batch())
    grads, _, _ = jax.eval_shape(lambda p, b: step._gradient_sums(p, None, b, 2),
                                 state.params, batch)
    assert {str(g.dtype) for g in jax.tree.leaves(grads)} == {"float32"}


def test_sampler_keeps_its_own_bf16_copy_and_cache_refreshed_by_set_params():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    sampler = Sampler(model, mesh=mesh(), compute_dtype=jnp.bfloat16, fuse_weights=False)
    assert {str(x.dtype) for x in jax.tree.leaves(sampler.state)} == {"bfloat16"}
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(model))} == {"float32"}
    cache, _ = sampler.new_cache(1, 64)
    assert {str(x.dtype) for x in jax.tree.leaves(cache)} == {"bfloat16"}
    new = jax.tree.map(lambda a: a + 1.0, nnx.state(model))  # e.g. after a train step
    sampler.set_params(new)
    for got, want in zip(jax.tree.leaves(sampler.state), jax.tree.leaves(new), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.bfloat16)))
    session = sampler.start([[1, 2, 3]], capacity=32)
    turn = session.decode(4, temperature=0.0)[0]
    assert len(turn.tokens) == 4 and np.all(np.isfinite(turn.logprobs))
