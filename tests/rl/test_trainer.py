"""Train step: exact gradient accumulation (both loss aggregations), sharded equals single
device, remat equals none; old_logp from the training forward, TIS and KL live; on a mesh,
FSDP's communication is weights and gradients, not activations."""

import dataclasses
import functools
import math
import re

import flax.nnx as nnx
import jax
import numpy as np
import optax
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.logprobs import token_logprobs
from spade_jax.rl.losses import LossAggregation
from spade_jax.rl.trainer import (
    Remat,
    TrainConfig,
    TrainStep,
    compute_copy,
    init_train_state,
    make_optimizer,
)
from spade_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  ffn_dim=48)


def batch(b=8, t=12, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        tokens=rng.integers(0, 53, (b, t)).astype(np.int32),
        loss_mask=(rng.random((b, t)) > 0.3).astype(np.float32),
        advantages=rng.normal(size=b).astype(np.float32),
        behaviour_logp=(-4.0 + 0.2 * rng.normal(size=(b, t))).astype(np.float32),
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


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_micro_batches_give_the_same_update(aggregation):
    sgd = optax.sgd(1.0)  # linear in the gradient: any accumulation error would show
    config = TrainConfig(loss_aggregation=aggregation)
    one, m1 = run((1, 1, 1), config, sgd)
    four, m4 = run((1, 1, 1), config, sgd, micro_batches=4)
    assert_close(one, four, atol=1e-6)
    np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-6)
    assert m1["tokens"] == m4["tokens"] and m1["samples"] == m4["samples"] == 8


def test_the_two_aggregations_differ():
    """Rows of different loss-mask lengths: the sample mean is not the token mean (else the
    exactness test above could not tell them apart)."""
    sgd = optax.sgd(1.0)
    tokens, _ = run((1, 1, 1), TrainConfig(loss_aggregation="token_mean"), sgd)
    samples, _ = run((1, 1, 1), TrainConfig(loss_aggregation="sample_mean"), sgd)
    with pytest.raises(AssertionError):
        assert_close(tokens, samples, atol=1e-6)


SHARDING_CONFIG = TrainConfig(learning_rate=1e-3)


@functools.cache
def single_device_adam_steps():
    """Two AdamW steps of SHARDING_CONFIG on one device: the reference of every mesh below,
    computed once."""
    return run((1, 1, 1), SHARDING_CONFIG, make_optimizer(SHARDING_CONFIG), steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 8, 1), (8, 1, 1)])
def test_sharded_step_equals_single_device(mesh_shape):
    single, ms = single_device_adam_steps()
    sharded, mm = run(mesh_shape, SHARDING_CONFIG, make_optimizer(SHARDING_CONFIG), steps=2)
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


@pytest.mark.parametrize("aggregation", list(LossAggregation))
def test_zero_advantage_rows_left_out_but_counted_give_the_same_update(aggregation):
    """Rows with advantage 0 contribute exactly 0: dropping them with their token and sample
    counts kept in the denominator (skipped_tokens, skipped_samples) gives the update of the
    full batch; forgetting the counts does not."""
    sgd = optax.sgd(1.0)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    full = batch(b=6, t=12)
    full["advantages"][[1, 3, 4]] = 0.0
    kept = {k: v[[0, 2, 5]] for k, v in full.items()}
    skipped = (int(full["loss_mask"][[1, 3, 4]].sum()), 3)
    results = []
    for groups, skip in (([(full, 1)], (0, 0)), ([(kept, 1)], skipped), ([(kept, 1)], (0, 0))):
        state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), sgd, mesh)
        step = TrainStep(CFG, sgd, mesh, TrainConfig(loss_aggregation=aggregation))
        state, metrics = step.grouped(state, groups, *skip)
        results.append((jax.tree.leaves(jax.device_get(state.params)), jax.device_get(metrics)))
    (want, m_full), (got, m_kept), (wrong, _) = results
    assert_close(want, got, atol=1e-6)
    np.testing.assert_allclose(m_full["loss"], m_kept["loss"], rtol=1e-6)
    assert m_full["tokens"] == m_kept["tokens"] == full["loss_mask"].sum()
    assert m_full["samples"] == m_kept["samples"] == 6
    assert (m_kept["skipped_tokens"], m_kept["skipped_samples"]) == skipped
    with pytest.raises(AssertionError):
        assert_close(want, wrong, atol=1e-6)


def sampler_gap_batch(model, deltas, seed=0):
    """A batch whose behaviour_logp is the model's own log-prob minus `deltas` (one per token,
    cycled): exp(old - behaviour) = exp(delta) exactly, whatever the random model emits."""
    data = batch(b=4, t=10, seed=seed)
    logp = np.asarray(token_logprobs(model, data["tokens"]))
    gap = np.resize(np.asarray(deltas, np.float32), logp.shape)
    data["behaviour_logp"] = (logp - gap).astype(np.float32)
    return data, gap


def one_step(config, data, micro_batches=1, optimizer=None, steps=1, reference=False):
    """(weights after `steps` steps on `data`, metrics of the last step)."""
    weights, metrics = steps_taken(config, data, micro_batches, optimizer, steps, reference)
    return weights, metrics[-1]


def steps_taken(config, data, micro_batches=1, optimizer=None, steps=1, reference=False):
    """(weights after `steps` steps on `data`, every step's metrics)."""
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    optimizer = optimizer or optax.sgd(1.0)
    state = init_train_state(Transformer(CFG, rngs=nnx.Rngs(0)), optimizer, mesh)
    step = TrainStep(CFG, optimizer, mesh, config, micro_batches=micro_batches)
    ref = compute_copy(state.params, "float32") if reference else None
    metrics = []
    for _ in range(steps):
        state, m = step(state, data, reference=ref)
        metrics.append(jax.device_get(m))
    return jax.tree.leaves(jax.device_get(state.params)), metrics


def test_old_logp_is_the_training_forward_so_the_ratio_is_exactly_one():
    """The sampler's log-probs are far from the policy's here (gaps of ±log 4), yet the PPO
    ratio is exactly 1 at every micro-step and nothing is clipped: old_logp is the train
    forward's own log-prob (one optimizer step per rollout). Were old_logp the sampler's, the
    ratio would be exp(gap)."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    data, _ = sampler_gap_batch(model, [np.log(4.0), -np.log(4.0)])
    _, metrics = one_step(TrainConfig(tis_cap=None), data, micro_batches=2)
    assert metrics["ratio"] == 1.0
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] == 0.0


def test_tis_cap_changes_the_update_when_the_log_probs_differ():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    data, gap = sampler_gap_batch(model, [np.log(4.0), -np.log(2.0), 0.0])
    off, _ = one_step(TrainConfig(tis_cap=None), data)
    cap2, m2 = one_step(TrainConfig(tis_cap=2.0), data)
    cap8, m8 = one_step(TrainConfig(tis_cap=8.0), data)
    for a, b in ((off, cap2), (cap2, cap8), (off, cap8)):
        with pytest.raises(AssertionError):
            assert_close(a, b, atol=1e-6)
    mask = data["loss_mask"] > 0
    ratio = np.exp(gap[mask])
    np.testing.assert_allclose(m2["tis_weight"], np.minimum(ratio, 2.0).mean(), rtol=1e-4)
    np.testing.assert_allclose(m2["tis_clip_fraction"], (ratio > 2.0).mean(), rtol=1e-6)
    np.testing.assert_allclose(m8["tis_weight"], ratio.mean(), rtol=1e-4)
    assert m8["tis_clip_fraction"] == 0.0 < m2["tis_clip_fraction"]


def test_tis_is_neutral_when_the_sampler_agrees_with_the_trainer():
    """behaviour_logp equal to the train forward's log-prob: weight 1 on every token, the same
    update as without TIS (so the weight compares against the train forward)."""
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    data, _ = sampler_gap_batch(model, [0.0])
    off, _ = one_step(TrainConfig(tis_cap=None), data)
    on, metrics = one_step(TrainConfig(tis_cap=2.0), data)
    assert_close(off, on, atol=1e-6)
    np.testing.assert_allclose(metrics["tis_weight"], 1.0, rtol=1e-5)


def test_kl_needs_the_reference_and_pulls_towards_it():
    """KL is 0 while the policy equals its frozen reference (the first step) and pulls back
    once they differ (the second step differs from the KL-free one); the reference survives
    the donated steps; kl_coef without reference weights is refused."""
    data = batch()
    adam = optax.adam(1e-2)
    with pytest.raises(ValueError, match="kl_coef=0.5 needs the frozen reference"):
        one_step(TrainConfig(kl_coef=0.5), data)
    off, _ = one_step(TrainConfig(), data, optimizer=adam, steps=2)
    on, (first, second) = steps_taken(TrainConfig(kl_coef=0.5), data, optimizer=adam, steps=2,
                                      reference=True)
    assert first["kl"] == 0.0 < second["kl"]
    with pytest.raises(AssertionError):
        assert_close(off, on, atol=1e-6)


def test_train_config_problems_name_the_values():
    bad = dataclasses.replace(TrainConfig(), tis_cap=-1.0, kl_coef=-0.1,
                              loss_aggregation="per_token")
    assert TrainConfig().problems() == []
    problems = bad.problems()
    assert "loss_aggregation='per_token': use one of ('token_mean', 'sample_mean')" in problems
    assert any(p.startswith("tis_cap=-1.0 must be > 0") for p in problems)
    assert "kl_coef=-0.1 must be >= 0" in problems


COLLECTIVE = re.compile(r"=\s*(.*?)\s(all-reduce|all-gather|all-to-all|reduce-scatter|"
                        r"collective-permute)(-start)?\(")
WIDE = ModelConfig(vocab_size=4096, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                   head_dim=16, ffn_dim=128, tie_embeddings=True)


def collective_sizes(mesh_shape, rows: int, length: int = 256) -> list[int]:
    """Elements moved by each collective of WIDE's compiled train step for rows x length."""
    mesh = make_mesh(mesh_shape)
    sgd = optax.sgd(1.0)
    state = init_train_state(Transformer(WIDE, rngs=nnx.Rngs(0)), sgd, mesh)
    step = TrainStep(WIDE, sgd, mesh, TrainConfig(logprob_chunk=128))
    shapes = {"tokens": ((rows, length), np.int32), "loss_mask": ((rows, length), np.float32),
              "advantages": ((rows,), np.float32), "behaviour_logp": ((rows, length), np.float32)}
    batch = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in shapes.items()}
    hlo = step.lower(state, batch).compile().as_text()
    return [sum(math.prod(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r"\w+\[([\d,]*)\]", match.group(1)))
            for match in COLLECTIVE.finditer(hlo)]


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 4, 1)])
def test_fsdp_communication_does_not_grow_with_the_batch(mesh_shape):
    """FSDP moves weights (gathered) and gradients (reduced), whatever the batch: 4x the rows
    may add the small per-row reductions, not activations. At this narrow width XLA, left to
    itself, contracted over the fsdp-split D and all-reduced whole-batch activations and
    logits: 2.3-2.9x more."""
    assert sum(collective_sizes(mesh_shape, 32)) < 1.25 * sum(collective_sizes(mesh_shape, 8))


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 2, 2)])
def test_no_collective_carries_logits(mesh_shape):
    """The chunked logits stay split by rows (and vocab over 'tensor'): no collective is larger
    than the tied [V, D] embedding. It once was every chunk's [rows, chunk, V] partial logits,
    and the tiny config's train step on 8 CPU devices ran 6x slower."""
    assert max(collective_sizes(mesh_shape, 8)) <= WIDE.vocab_size * WIDE.d_model


def test_weight_decay_skips_the_norms_as_megatron_does():
    """Megatron (the reference's trainer through Slime) gives 1-D parameters (norm scales,
    biases) no weight decay; our layers' norms are stacked, so they are told by name."""
    params = nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)))
    optimizer = make_optimizer(TrainConfig(learning_rate=0.5, weight_decay=0.1))
    zero = jax.tree.map(np.zeros_like, params)
    updates, _ = optimizer.update(zero, optimizer.init(params), params)
    moved = {jax.tree_util.keystr(path[:1]): bool(np.any(np.asarray(u) != 0))
             for path, u in jax.tree_util.tree_leaves_with_path(updates)}
    assert {k for k, m in moved.items() if not m} == {
        "['attn_norm']", "['mlp_norm']", "['final_norm']"}, moved
    # a matrix decays by lr * wd of itself
    np.testing.assert_allclose(np.asarray(updates["wq"].value),
                               -0.5 * 0.1 * np.asarray(params["wq"].value), rtol=1e-6)
