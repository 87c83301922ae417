"""Train step: exact gradient accumulation, sharded equals single device, remat equals none."""

import flax.nnx as nnx
import jax
import numpy as np
import optax
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.trainer import Remat, TrainConfig, TrainStep, init_train_state, make_optimizer
from spade_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  ffn_dim=48)


def batch(b=8, t=12, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        tokens=rng.integers(0, 53, (b, t)).astype(np.int32),
        loss_mask=(rng.random((b, t)) > 0.3).astype(np.float32),
        advantages=rng.normal(size=b).astype(np.float32),
        old_logp=(-4.0 + 0.2 * rng.normal(size=(b, t))).astype(np.float32),
    )


def run(mesh_shape, config, optimizer, steps=1, micro_batches=1):
    mesh = make_mesh(mesh_shape, jax.devices()[: int(np.prod(mesh_shape))])
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    state = init_train_state(model, optimizer, mesh)
    step = TrainStep(CFG, optimizer, mesh, config, micro_batches=micro_batches)
    for _ in range(steps):
        state, metrics = step(state, batch())
    return jax.tree.leaves(jax.device_get(state.params)), jax.device_get(metrics)


def assert_close(a, b, atol):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=atol)


def test_micro_batches_give_the_same_update():
    sgd = optax.sgd(1.0)  # linear in the gradient: any accumulation error would show
    one, m1 = run((1, 1, 1), TrainConfig(), sgd)
    four, m4 = run((1, 1, 1), TrainConfig(), sgd, micro_batches=4)
    assert_close(one, four, atol=1e-6)
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-6)
    assert m1["tokens"] == m4["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 8, 1), (8, 1, 1)])
def test_sharded_step_equals_single_device(mesh_shape):
    config = TrainConfig(learning_rate=1e-3)
    single, ms = run((1, 1, 1), config, make_optimizer(config), steps=2)
    sharded, mm = run(mesh_shape, config, make_optimizer(config), steps=2)
    assert_close(single, sharded, atol=2e-5)  # Adam normalises: ~lr x float noise / |g|
    np.testing.assert_allclose(ms["loss"], mm["loss"], rtol=1e-5)


def test_remat_matches_no_remat():
    sgd = optax.sgd(1.0)
    plain, _ = run((1, 1, 1), TrainConfig(), sgd)
    remat, _ = run((1, 1, 1), TrainConfig(remat=Remat.BLOCK, logprob_chunk=5), sgd)
    assert_close(plain, remat, atol=1e-6)


def test_grouped_step_over_different_lengths_equals_one_padded_batch():
    """Rows padded to their own group length give the update of all rows padded to the longest."""
    sgd = optax.sgd(1.0)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    full = batch(b=6, t=12)
    short = {k: v[2:, :7] if v.ndim == 2 else v[2:] for k, v in full.items()}
    padded = {k: v.copy() for k, v in full.items()}  # rows 2.. hold 7 real tokens, then padding
    padded["mask"] = np.ones((6, 12), bool)
    padded["mask"][2:, 7:] = False
    padded["loss_mask"][2:, 7:] = 0.0
    short["mask"] = np.ones((4, 7), bool)
    results = []
    for groups in ([(padded, 1)], [({**{k: v[:2] for k, v in padded.items()}}, 1), (short, 2)]):
        state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), sgd, mesh)
        step = TrainStep(CFG, sgd, mesh, TrainConfig())
        state, metrics = step.grouped(state, groups)
        results.append((jax.tree.leaves(jax.device_get(state.params)), jax.device_get(metrics)))
    (one, m1), (two, m2) = results
    assert_close(one, two, atol=1e-6)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    assert m1["tokens"] == m2["tokens"]


def test_zero_advantage_rows_left_out_but_counted_give_the_same_update():
    """Rows with advantage 0 contribute exactly 0: dropping them with their token count kept in
    the denominator (skipped_tokens) gives the update of the full batch; forgetting the count
    does not."""
    sgd = optax.sgd(1.0)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    full = batch(b=6, t=12)
    full["advantages"][[1, 3, 4]] = 0.0
    kept = {k: v[[0, 2, 5]] for k, v in full.items()}
    skipped = int(full["loss_mask"][[1, 3, 4]].sum())
    results = []
    for groups, skip in (([(full, 1)], 0), ([(kept, 1)], skipped), ([(kept, 1)], 0)):
        state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), sgd, mesh)
        step = TrainStep(CFG, sgd, mesh, TrainConfig())
        state, metrics = step.grouped(state, groups, skipped_tokens=skip)
        results.append((jax.tree.leaves(jax.device_get(state.params)), jax.device_get(metrics)))
    (want, m_full), (got, m_kept), (wrong, _) = results
    assert_close(want, got, atol=1e-6)
    np.testing.assert_allclose(m_full["loss"], m_kept["loss"], rtol=1e-6)
    assert m_full["tokens"] == m_kept["tokens"] == full["loss_mask"].sum()
    assert m_kept["skipped_tokens"] == skipped > 0
    with pytest.raises(AssertionError):
        assert_close(want, wrong, atol=1e-6)
