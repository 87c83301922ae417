"""Train batches come in a few fixed shapes: many row counts and lengths compile a handful of
programs, and the padding (rows and tokens) changes neither the loss nor the gradients."""

import contextlib

import flax.nnx as nnx
import jax
import jax.monitoring
import numpy as np
import optax
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.losses import LossAggregation
from spade_jax.rl.trainer import TrainConfig, TrainStep, init_train_state
from spade_jax.sharding import make_mesh
from spade_jax.spade.batch import Role, TrainSample, row_bucket, train_groups

CFG = ModelConfig(vocab_size=53, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                  ffn_dim=24)
MAX_LEN, MICRO_BATCH = 128, 4


def samples(rng, count, longest):
    out = []
    for i in range(count):
        n = int(rng.integers(4, longest + 1))
        mask = np.zeros(n, bool)
        mask[n // 2:] = True
        out.append(TrainSample(rng.integers(0, 53, n).astype(np.int32), mask,
                               np.where(mask, -3.0, 0.0).astype(np.float32),
                               float(rng.normal()), Role.DESIGNER if i % 3 == 0 else Role.AGENT))
    return out


def fresh_step(aggregation=LossAggregation.SAMPLE_MEAN):
    sgd = optax.sgd(1.0)  # the update is minus the gradient: any padding effect would show
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), sgd, mesh)
    return state, TrainStep(CFG, sgd, mesh, TrainConfig(loss_aggregation=aggregation))


@contextlib.contextmanager
def counting_backend_compiles():
    """A list that receives one entry per XLA compilation made inside the block."""
    compiles = []

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def test_row_buckets():
    assert [row_bucket(n, 1, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [row_bucket(n, 4, 16) for n in (1, 4, 5, 9, 16)] == [4, 4, 8, 16, 16]
    assert row_bucket(3, 2, 6) == 4 and row_bucket(5, 2, 6) == 6
    with pytest.raises(ValueError, match="rows=9"):
        row_bucket(9, 1, 8)


def test_many_row_counts_and_lengths_compile_a_handful_of_programs():
    """Ten "cycles" of 1-20 samples of 4-200 tokens: every call is (micro-batch or row bucket)
    x (64 or 128 tokens), so the step compiles at most 2 lengths x 3 row counts + the empty sums
    + the update = 8 programs, and a second pass over new batches compiles nothing (XLA's own
    compile events) and adds no program to the step's caches."""
    rng = np.random.default_rng(0)
    state, step = fresh_step()
    shapes = set()

    def cycle(state):
        batch = samples(rng, int(rng.integers(1, 21)), 200)
        groups = train_groups(batch, pad_id=0, data_parallel=1, micro_batch=MICRO_BATCH,
                              max_len=MAX_LEN)
        shapes.update(b["tokens"].shape for b, _ in groups)
        return step.grouped(state, groups)[0]

    with counting_backend_compiles() as compiles:
        for _ in range(10):
            state = cycle(state)
    assert shapes <= {(rows, length) for rows in (1, 2, 4) for length in (64, 128)}
    assert len(shapes) >= 4  # the draws did cover several shapes
    assert step.compiled_programs() == len(shapes) + 2 <= 8
    programs, train_compiles = step.compiled_programs(), len(compiles)
    with counting_backend_compiles() as compiles:
        for _ in range(5):
            state = cycle(state)
    assert len(compiles) == 0, f"{len(compiles)} recompiles after {train_compiles} compiles"
    assert step.compiled_programs() == programs  # none loaded from a persistent cache either


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_padded_calls_give_the_loss_and_gradients_of_one_unpadded_batch(aggregation):
    """7 samples as train_groups' padded calls (rows to buckets, tokens to 64/128) give the
    update of one batch holding exactly the samples' tokens (no padding row, no padded length
    beyond the longest sample)."""
    rng = np.random.default_rng(1)
    batch = samples(rng, 7, 120)
    groups = train_groups(batch, pad_id=0, data_parallel=1, micro_batch=MICRO_BATCH,
                          max_len=MAX_LEN)
    assert sum(b["tokens"].shape[0] for b, _ in groups) > len(batch)  # some rows are padding
    longest = max(len(s.tokens) for s in batch)
    exact = {"tokens": np.zeros((7, longest), np.int32), "mask": np.zeros((7, longest), bool),
             "loss_mask": np.zeros((7, longest), bool),
             "behaviour_logp": np.zeros((7, longest), np.float32),
             "advantages": np.zeros((7, longest), np.float32)}
    for row, s in enumerate(batch):
        n = len(s.tokens)
        exact["tokens"][row, :n], exact["mask"][row, :n] = s.tokens, True
        exact["loss_mask"][row, :n] = s.loss_mask
        exact["behaviour_logp"][row, :n] = s.behaviour_logp
        exact["advantages"][row, :n] = np.where(s.loss_mask, s.advantage, 0.0)
    results = []
    for calls in (groups, [(exact, 1)]):
        state, step = fresh_step(aggregation)
        state, metrics = step.grouped(state, calls)
        results.append((jax.tree.leaves(jax.device_get(state.params)), jax.device_get(metrics)))
    (padded, m_padded), (unpadded, m_unpadded) = results
    for a, b in zip(padded, unpadded, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(m_padded["loss"], m_unpadded["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_padded["grad_norm"], m_unpadded["grad_norm"], rtol=1e-5)
    assert m_padded["samples"] == m_unpadded["samples"] == 7
    assert m_padded["tokens"] == m_unpadded["tokens"]
