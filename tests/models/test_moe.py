"""The routed dropless MoE equals the dense reference, alone and expert-parallel on 8 fake CPUs."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from spade_jax.models import moe
from spade_jax.sharding import make_mesh

E, K, D, F = 8, 2, 16, 12
MESHES = [(1, 8, 1), (2, 2, 2), (1, 2, 4)]


def _params(seed=0, router_bias=None):
    keys = jax.random.split(jax.random.key(seed), 5)
    router = jax.random.normal(keys[0], (D, E)) * 0.3
    if router_bias is not None:  # steer every token to the experts favoured by the bias
        router = router * 0.01 + router_bias
    gate = jax.random.normal(keys[1], (E, D, F)) * 0.3
    up = jax.random.normal(keys[2], (E, D, F)) * 0.3
    down = jax.random.normal(keys[3], (E, F, D)) * 0.3
    x = jax.random.normal(keys[4], (8, 6, D))
    return x, router, gate, up, down


def _collapsed_router():
    """A router sending every token (x has positive mean) to experts 5 and 2 only."""
    bias = np.zeros((D, E), np.float32)
    bias[:, 5], bias[:, 2] = 4.0, 2.0
    return jnp.asarray(bias)


def _routed(*args):
    """The routed layer's output alone (dropless)."""
    return moe.moe_mlp(*args)[0]


def _loss(fn):
    def loss(x, router, gate, up, down):
        out = fn(x, router, gate, up, down, K, True)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))
    return loss


def _value_and_grads(fn, args):
    return jax.value_and_grad(_loss(fn), argnums=tuple(range(5)))(*args)


def _assert_close(a, b):
    for got, want in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("collapsed", [False, True])
def test_routed_equals_dense_on_one_device(collapsed):
    args = _params(router_bias=_collapsed_router() if collapsed else None)
    if collapsed:
        args = (jnp.abs(args[0]),) + args[1:]
        top_idx, _ = moe.route(args[0], args[1], K, True)
        assert set(np.unique(top_idx)) == {2, 5}  # all tokens on one pair; six experts idle
    _assert_close(_routed(*args, K, True), moe.moe_mlp_dense(*args, K, True))
    _assert_close(_value_and_grads(_routed, args), _value_and_grads(moe.moe_mlp_dense, args))


def _layer_specs(sharding: moe.MoeSharding) -> list[PartitionSpec]:
    """Specs of (x, router, gate, up, down) as the model shards them (one layer's weights)."""
    gate_axes, down_axes = sharding.weight_axes()
    return [PartitionSpec(("data", "fsdp")), PartitionSpec("fsdp"), PartitionSpec(*gate_axes[1:]),
            PartitionSpec(*gate_axes[1:]), PartitionSpec(*down_axes[1:])]


def _sharded_routed(sharding: moe.MoeSharding):
    return lambda *a: moe.moe_mlp(*a, sharding=sharding)[0]


@pytest.mark.parametrize(("shape", "sharding"), [
    *((shape, moe.MoeSharding.EXPERTS) for shape in MESHES),
    *((shape, moe.MoeSharding.FFN) for shape in MESHES if shape[2] > 1)])  # tensor 1: same path
@pytest.mark.parametrize("collapsed", [False, True])
def test_tensor_parallel_experts_equal_dense(shape, collapsed, sharding):
    """By expert and by hidden column, on every mesh: the dense layer's values and gradients,
    with all tokens on two experts (six idle) too."""
    mesh = make_mesh(shape)
    args = _params(seed=1, router_bias=_collapsed_router() if collapsed else None)
    if collapsed:
        args = (jnp.abs(args[0]),) + args[1:]
    want = _value_and_grads(moe.moe_mlp_dense, args)
    sharded = [jax.device_put(a, NamedSharding(mesh, s))
               for a, s in zip(args, _layer_specs(sharding), strict=True)]
    with jax.set_mesh(mesh):
        step = jax.jit(lambda *a: _value_and_grads(_sharded_routed(sharding), a))
        text = step.lower(*sharded).as_text()
        got = step(*sharded)
    if shape[2] > 1:
        assert "shard_map" in text or "sdy.manual_computation" in text  # tensor-parallel path
    _assert_close(got, want)


def test_ffn_split_buffers_hold_the_real_copies_where_expert_split_ones_hold_the_worst_case():
    """XLA's FLOPs per device on 4 'tensor' ranks against one device's routed layer: split by
    hidden column each rank does a quarter of the work; split by expert (2 experts a rank,
    top-2) each rank's dropless buffer has room for every token's 2 copies, 4x its share."""
    d, f, tokens = 256, 512, 256
    keys = jax.random.split(jax.random.key(0), 5)
    args = (jax.random.normal(keys[0], (1, tokens, d)),
            jax.random.normal(keys[1], (d, E)), jax.random.normal(keys[2], (E, d, f)),
            jax.random.normal(keys[3], (E, d, f)), jax.random.normal(keys[4], (E, f, d)))

    def flops(mesh, sharding):
        with jax.set_mesh(mesh):
            fn = jax.jit(lambda *a: moe.moe_mlp(*a, K, True, sharding=sharding)[0])
            return fn.lower(*args).compile().cost_analysis()["flops"]

    one = flops(make_mesh((1, 1, 1), jax.devices()[:1]), moe.MoeSharding.EXPERTS)
    tp4 = make_mesh((1, 1, 4), jax.devices()[:4])
    by_column = flops(tp4, moe.MoeSharding.FFN)
    by_expert = flops(tp4, moe.MoeSharding.EXPERTS)
    print("one device", one, "ffn", by_column, "experts", by_expert)
    assert 0.2 * one < by_column < 0.3 * one
    assert by_expert > 2.5 * by_column  # 4x the rows, less padding a row (measured 2.98x)


@pytest.mark.parametrize(("shape", "sharding"), [((1, 1, 1), moe.MoeSharding.EXPERTS),
                                                  ((1, 2, 4), moe.MoeSharding.EXPERTS),
                                                  ((1, 2, 4), moe.MoeSharding.FFN)])
def test_dropless_token_chunks_equal_dense_values_and_gradients(shape, sharding, monkeypatch):
    """Chunks of 5 tokens (48 tokens: 24 per fsdp shard, the last chunk padded) give the dense
    layer's outputs and gradients, with a collapsed router too, one device and expert-parallel,
    and nothing counted as dropped."""
    monkeypatch.setattr(moe, "MOE_TOKEN_CHUNK", 5)
    buffers = []
    local_experts = moe._local_experts

    def spy(*args):
        buffers.append(args[-1])
        return local_experts(*args)

    monkeypatch.setattr(moe, "_local_experts", spy)
    mesh = make_mesh(shape, jax.devices()[:int(np.prod(shape))])
    for collapsed in (False, True):
        args = _params(seed=3, router_bias=_collapsed_router() if collapsed else None)
        if collapsed:
            args = (jnp.abs(args[0]),) + args[1:]
        with jax.set_mesh(mesh):
            got = jax.jit(lambda *a: _value_and_grads(_sharded_routed(sharding), a))(*args)
            load = jax.jit(lambda *a: moe.moe_mlp(*a, K, True, sharding=sharding)[1])(*args)
        assert set(buffers) == {5 * K}  # every buffer is one chunk's worst case
        _assert_close(got, _value_and_grads(moe.moe_mlp_dense, args))
        assert float(load.dropped) == 0.0
        assert float(jnp.sum(load.expert_copies)) == 48 * K


def test_dropless_token_chunks_bound_the_expert_buffers(monkeypatch):
    """XLA's temporaries for 4096 tokens on one device: one dropless buffer of all 4096 x k
    copies against chunks of 256 tokens, which need several times less."""
    x = jax.random.normal(jax.random.key(0), (1, 4096, D))
    args = (x,) + _params()[1:]

    def temp_bytes():
        fn = jax.jit(lambda *a: moe.moe_mlp(*a, K, True)[0])
        return fn.lower(*args).compile().memory_analysis().temp_size_in_bytes

    whole = temp_bytes()
    monkeypatch.setattr(moe, "MOE_TOKEN_CHUNK", 256)
    chunked = temp_bytes()
    print("whole", whole, "chunked", chunked)
    assert chunked * 3 < whole, (chunked, whole)


@pytest.mark.parametrize("sharding", list(moe.MoeSharding))
def test_train_step_runs_the_experts_tensor_parallel_and_equals_one_device(sharding):
    """The model's MoE path under the train step: shard_map on (1, 2, 4), the weights split as
    `sharding` says, same update and router statistics as 1 CPU."""
    import flax.nnx as nnx
    import optax

    from spade_jax.models.config import ModelConfig
    from spade_jax.models.transformer import Transformer
    from spade_jax.rl.trainer import TrainConfig, TrainStep, init_train_state

    cfg = ModelConfig(vocab_size=53, d_model=D, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                      ffn_dim=0, qk_norm=True, n_experts=E, n_experts_per_tok=K,
                      expert_ffn_dim=F, family="qwen3_moe", moe_sharding=sharding)
    rng = np.random.default_rng(0)
    batch = dict(tokens=rng.integers(0, 53, (8, 10)).astype(np.int32),
                 loss_mask=np.ones((8, 10), np.float32),
                 advantages=rng.normal(size=8).astype(np.float32),
                 behaviour_logp=np.full((8, 10), -4.0, np.float32))
    params, loads = {}, {}
    for shape in [(1, 1, 1), (1, 2, 4)]:
        mesh = make_mesh(shape, jax.devices()[:int(np.prod(shape))])
        state = init_train_state(Transformer(cfg, rngs=nnx.Rngs(0)), optax.sgd(1.0), mesh)
        step = TrainStep(cfg, optax.sgd(1.0), mesh, TrainConfig())
        if shape[2] > 1:
            abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                   sharding=a.sharding), state)
            assert "manual_computation" in step.lower(abstract, batch).as_text()
            split = 1 if sharding is moe.MoeSharding.EXPERTS else 3  # E or F over 'tensor'
            assert state.params["w_gate"].sharding.spec[split] == "tensor"
        state, metrics = step(state, batch)
        params[shape] = jax.tree.leaves(jax.device_get(state.params))
        loads[shape] = [float(metrics[k]) for k in ("router_max_over_mean_load",
                                                     "router_dropped_fraction")]
    _assert_close(params[(1, 2, 4)], params[(1, 1, 1)])
    assert loads[(1, 2, 4)] == pytest.approx(loads[(1, 1, 1)])
    max_over_mean, dropped = loads[(1, 1, 1)]
    assert 1.0 < max_over_mean <= E / K and dropped == 0.0  # dropless


def test_tile_rows_weigh_padding_against_weight_gathers():
    """Golden tiles at 30B-A3B's expert shapes (rows = tokens x 8 copies), each the fastest
    or near it in the 8..512 sweep of `bench/moe.py --tile-sweep` (docs/performance.md); 1
    where no row needs a tile of its own."""
    assert moe.tile_count(4096, 128, 32) == 252
    assert moe.tile_rows(100, 128) == 1
    assert moe.tile_rows(512, 128) == 16  # 64 tokens over 128 experts
    assert moe.tile_rows(4096, 128) == 32  # 512 tokens (ffn ranks: the same groups)
    assert moe.tile_rows(4096, 16) == 128  # 512 tokens on an expert rank of 16
    assert moe.tile_rows(32768, 128) == 128  # a 4096-token chunk
    assert moe.tile_rows(32768, 16) == 256
    assert moe.tile_rows(10**7, 2) == 512  # the largest tile


@pytest.mark.parametrize(("rows", "sizes"), [
    (5, [0, 2, 0, 3, 0]), (5, [5, 0, 0, 0, 0]), (5, [1, 1, 0, 0, 2]),  # 1-row tiles
    (36, [0, 5, 0, 30, 1]), (36, [36, 0, 0, 0, 0]), (36, [3, 4, 0, 0, 2]),  # 16-row tiles
    (400, [1, 150, 0, 233, 9]), (400, [400, 0, 0, 0, 0]), (400, [17, 0, 0, 0, 3]),  # 64-row
])
def test_tiled_grouped_matmul_equals_ragged_dot(rows, sizes):
    """Empty groups, one group taking every row, and rows past the groups (zeros)."""
    assert moe.tile_rows(rows, 5) == {5: 1, 36: 16, 400: 64}[rows]
    lhs = jax.random.normal(jax.random.key(0), (rows, 7))
    rhs = jax.random.normal(jax.random.key(1), (5, 7, 3))
    group_sizes = jnp.array(sizes, jnp.int32)
    want = jax.lax.ragged_dot(lhs, rhs, group_sizes)
    np.testing.assert_allclose(moe.tiled_grouped_matmul(lhs, rhs, group_sizes), want, atol=1e-5)
    grads = [jax.grad(lambda a, b, f=f: jnp.sum(jnp.sin(f(a, b, group_sizes))), argnums=(0, 1))(
        lhs, rhs) for f in (moe.tiled_grouped_matmul, jax.lax.ragged_dot)]
    _assert_close(grads[0], grads[1])


def test_router_load_counts_copies_per_expert_and_nothing_dropped_when_dropless():
    args = _params()
    out, load = moe.moe_mlp(*args, K, True)
    top_idx, _ = moe.route(args[0], args[1], K, True)
    np.testing.assert_array_equal(load.expert_copies,
                                  np.bincount(np.asarray(top_idx).ravel(), minlength=E))
    assert float(load.dropped) == 0.0


def test_load_metrics_of_balanced_collapsed_and_dropping_loads():
    balanced = moe.RouterLoad(jnp.full((2, E), 6.0), jnp.zeros(2))
    collapsed = moe.RouterLoad(jnp.array([[24.0, 24.0] + [0.0] * (E - 2), [6.0] * E]),
                               jnp.array([12.0, 0.0]))
    assert float(moe.load_metrics(balanced)["router_max_over_mean_load"]) == 1.0
    metrics = moe.load_metrics(collapsed)
    assert float(metrics["router_max_over_mean_load"]) == pytest.approx(E / 2)  # worst layer
    assert float(metrics["router_dropped_fraction"]) == pytest.approx(12 / 96)


def test_buffer_rows_dropless_worst_case_and_capacity_share():
    assert moe.buffer_rows(100, 8, 16, 8, None) == 800  # every token's 8 copies here
    assert moe.buffer_rows(100, 8, 16, 8, 1.25) == 125  # 1.25 x 100·8/8
    assert moe.buffer_rows(100, 2, 1, 8, 100.0) == 100  # never past the worst case
    with pytest.raises(ValueError, match="moe_capacity_factor=0"):
        moe.buffer_rows(100, 8, 16, 8, 0)


@pytest.mark.parametrize("capacity_factor", [None, 4.0])
def test_capacity_that_never_binds_equals_dense(capacity_factor):
    """Split by expert on (1, 2, 4) a factor of tp (4) gives each rank room for all its
    copies: no drop."""
    mesh = make_mesh((1, 2, 4))
    args = _params(seed=2)
    with jax.set_mesh(mesh):
        out, load = jax.jit(lambda *a: moe.moe_mlp(
            *a, K, True, capacity_factor, sharding=moe.MoeSharding.EXPERTS))(*args)
    _assert_close(out, moe.moe_mlp_dense(*args, K, True))
    assert float(load.dropped) == 0.0


def test_capacity_drops_the_latest_tokens_copies_and_counts_them():
    """Split by expert on (1, 2, 4), collapsed router: each token sends one copy to rank 1
    (expert 2) and one to rank 2 (expert 5). Per fsdp shard of 24 tokens a rank holds 1.0 x
    24·2/4 = 12 copies, so the first 12 tokens of each shard keep both copies (= dense) and the
    last 12 lose both."""
    mesh = make_mesh((1, 2, 4))
    args = _params(seed=1, router_bias=_collapsed_router())
    args = (jnp.abs(args[0]),) + args[1:]
    with jax.set_mesh(mesh):
        out, load = jax.jit(lambda *a: moe.moe_mlp(
            *a, K, True, 1.0, sharding=moe.MoeSharding.EXPERTS))(*args)
    want = np.asarray(moe.moe_mlp_dense(*args, K, True)).reshape(2, 24, D)
    got = np.asarray(out).reshape(2, 24, D)
    np.testing.assert_allclose(got[:, :12], want[:, :12], atol=1e-5)
    np.testing.assert_array_equal(got[:, 12:], 0.0)
    assert float(load.dropped) == 48.0  # 24 tokens x 2 copies
    assert float(moe.load_metrics(load)["router_dropped_fraction"]) == 0.5


def _megablox_interpret(lhs, rhs, group_sizes):
    return moe.megablox_grouped_matmul(lhs, rhs, group_sizes, interpret=True)


def test_megablox_kernel_in_interpret_mode_equals_ragged_dot():
    """The TPU kernel run by Pallas's interpreter on CPU: rows inside the groups (the kernel
    leaves the rest unwritten), values and gradients; 200 rows pad to two 128-row tiles."""
    lhs = jax.random.normal(jax.random.key(0), (200, 128))
    rhs = jax.random.normal(jax.random.key(1), (4, 128, 128))
    group_sizes = jnp.array([0, 100, 20, 56], jnp.int32)
    real = 176
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b, group_sizes)[:real]))  # noqa: E731
    got = _megablox_interpret(lhs, rhs, group_sizes)[:real]
    np.testing.assert_allclose(got, jax.lax.ragged_dot(lhs, rhs, group_sizes)[:real],
                               atol=1e-4, rtol=1e-5)
    grads = [jax.grad(loss(f), argnums=(0, 1))(lhs, rhs)
             for f in (_megablox_interpret, jax.lax.ragged_dot)]
    np.testing.assert_allclose(grads[0][0][:real], grads[1][0][:real], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(grads[0][1], grads[1][1], atol=1e-4, rtol=1e-5)


def test_routed_layer_masks_the_megablox_kernels_unwritten_rows(monkeypatch):
    """The expert-parallel layer on the interpreted TPU kernel equals dense in value and
    gradients: on (1, 2, 4) each rank's dropless buffer (24 tokens x 2 copies) is longer than
    its share of the copies, so rows the kernel leaves unwritten (NaN when interpreted) sit in
    it and must not reach the output or x's gradient."""
    monkeypatch.setattr(moe, "grouped_matmul", _megablox_interpret)
    args = _params(seed=3)
    with jax.set_mesh(make_mesh((1, 2, 4))):
        got = jax.jit(lambda *a: _value_and_grads(_routed, a))(*args)
    _assert_close(got, _value_and_grads(moe.moe_mlp_dense, args))


@pytest.mark.parametrize("platform, op", [("tpu", "tpu_custom_call"), ("cuda", None),
                                          ("cpu", None)])
def test_grouped_matmul_picks_megablox_on_tpu_and_tiles_elsewhere(platform, op):
    """XLA's ragged dot is never emitted: on GPU it ran slower than the dense layer."""
    lhs = jax.ShapeDtypeStruct((256, 128), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, 128, 128), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32)
    text = jax.jit(moe.grouped_matmul).trace(lhs, rhs, sizes).lower(
        lowering_platforms=(platform,)).as_text()
    for other in ("tpu_custom_call", "ragged_dot"):
        assert (other in text) == (other == op), (platform, other)


def test_capacity_factor_comes_from_the_run_config_and_bad_values_are_named():
    from spade_jax.config import load_config_file, parse
    from spade_jax.errors import ConfigError

    cfg = load_config_file("30b")
    assert parse(cfg).model.arch.moe_capacity_factor is None  # dropless by default
    cfg.model.moe_capacity_factor = 1.25
    assert parse(cfg).model.arch.moe_capacity_factor == 1.25
    cfg.model.moe_capacity_factor = -1.0
    with pytest.raises(ConfigError, match=r"model.moe_capacity_factor=-1.0 must be > 0"):
        parse(cfg)


def test_moe_sharding_comes_from_the_run_config_and_bad_values_are_named():
    from spade_jax.config import load_config_file, parse
    from spade_jax.errors import ConfigError

    cfg = load_config_file("30b")
    cfg.model.moe_sharding = "ffn"
    assert parse(cfg).model.arch.moe_sharding is moe.MoeSharding.FFN
    cfg.model.moe_sharding = "columns"
    with pytest.raises(ConfigError, match=r"model.moe_sharding='columns': use one of "
                                          r"\('experts', 'ffn'\)"):
        parse(cfg)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="needs libtpu: pip install -e .[tpu]")
def test_tpu_compiler_takes_column_split_experts_and_counts_exact_buffers():
    """Compiled ahead of time for v5p-8 (4 chips on 'tensor', no TPU needed), values and
    gradients: the megablox kernel takes the column split's 96-column tiles, and XLA's FLOPs
    per chip are a quarter of the expert split's, whose dropless buffer (2 experts a rank,
    top-2) has room for every token's copies."""
    from spade_jax.plan import tpu_topology_devices

    d, f, tokens = 256, 384, 512
    shapes = [(1, tokens, d), (d, E), (E, d, f), (E, d, f), (E, f, d)]
    mesh = make_mesh((1, 1, 4), tpu_topology_devices("v5p-8"))

    def flops(sharding):
        args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
                for shape, spec in zip(shapes, _layer_specs(sharding), strict=True)]
        with jax.set_mesh(mesh):
            step = jax.jit(lambda *a: _value_and_grads(_sharded_routed(sharding), a))
            compiled = step.lower(*args).compile()
        return compiled.cost_analysis()["flops"]

    by_column, by_expert = flops(moe.MoeSharding.FFN), flops(moe.MoeSharding.EXPERTS)
    print("ffn", by_column, "experts", by_expert)
    assert 3.0 < by_expert / by_column < 4.5, (by_column, by_expert)
