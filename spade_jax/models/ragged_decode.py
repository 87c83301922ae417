"""A decode step's attention that reads each row's keys only up to its own last query (Pallas).

The XLA decode (`attention._decode_block`) multiplies every row's queries with the whole cache
window, and the window is the longest row's: in a continuous batch at pod scale (hundreds of
conversations, 32k-slot windows) a short row pays for the longest one. This kernel walks the
window in key blocks per row (grid: rows x blocks) with an online softmax, and for a row's
blocks after its last query's slot (or its last key, for a finished row) it neither computes
nor copies anything: their block index repeats the row's last live block, so Pallas' pipeline
issues no new DMA for them. What a step reads then follows the rows' own lengths. On TPU it
runs compiled (Mosaic); elsewhere the interpreter runs it, for tests.

The cache is `KVLayout.SEQUENCE_MAJOR` ([B, S, K, Dh], the TPU layout), read as it lies: a
block holds every KV head's keys of its slots, [block, K, Dh] (viewing it as [B, S, K * Dh]
instead made the TPU compiler copy the whole cache each step). A row's keys fill its slots
[0, key_end) without gaps, as the sampler's do, so two numbers per row (its first query's
slot and its key end) are the whole mask, read from scalar memory.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from spade_jax.models.attention import MASK_VALUE, RAGGED_MIN_BLOCK
from spade_jax.sharding import MESH_AXES, fit_spec, kv_cache_axes

# Keys per kernel step. Mosaic's compile time grows faster than the block (its per-head
# strided loads unroll by slot); 128 keeps a kernel to seconds (docs/performance.md).
RAGGED_KEY_BLOCK = 128


def ragged_block_size(n_keys: int, preferred: int = RAGGED_KEY_BLOCK) -> int:
    """Keys per step: the largest power of two up to `preferred` dividing `n_keys` (the
    sampler's windows, 2^i or 1.5 * 2^i slots, have one of at least `RAGGED_MIN_BLOCK`)."""
    block = min(1 << (preferred.bit_length() - 1), n_keys & -n_keys)
    if block < RAGGED_MIN_BLOCK:
        raise ValueError(f"ragged decode needs a window divisible by {RAGGED_MIN_BLOCK} slots, "
                         f"got {n_keys}")
    return block


def last_live_slot(first_slot, key_end, n_queries: int):
    """The furthest slot any of a row's queries sees: its last query's, or its last key's."""
    return jnp.minimum(first_slot + n_queries, key_end) - 1


def live_key_block(step, last_slot, block: int):
    """The key block a row's grid `step` copies in: block `step` up to the one holding the
    row's `last_live_slot`, that one again after it, so the pipeline copies nothing new."""
    # lax.div truncates, the floor of these slots (a floor division lowers through a sign that
    # Mosaic looks up for the device's generation); a row without keys (-1) reads block 0
    return jnp.minimum(step, jax.lax.div(jnp.maximum(last_slot, 0), block))


def _kernel(first_slot_ref, key_end_ref, q_ref, k_ref, v_ref, out_ref, max_ref, sum_ref,
            acc_ref, *, n_queries: int, block: int, head_dim: int):
    """One (row, key block) step: fold the block into the row's running max, sum and output
    for every KV head, if any of the row's queries can see a key of it."""
    row, step = pl.program_id(0), pl.program_id(1)
    first, key_end = first_slot_ref[row], key_end_ref[row]

    @pl.when(step == 0)
    def _start():
        max_ref[...] = jnp.full(max_ref.shape, MASK_VALUE, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(step * block <= last_live_slot(first, key_end, n_queries))
    def _fold_block():
        n_kv, n_rows = q_ref.shape[1], q_ref.shape[2]
        slot = step * block + jax.lax.broadcasted_iota(jnp.int32, (n_rows, block), 1)
        # query rows are (group, query) pairs, query fastest: query c sits at slot first + c
        # (unsigned: Mosaic lowers a signed remainder through the device's generation)
        query = jax.lax.rem(jax.lax.broadcasted_iota(jnp.uint32, (n_rows, block), 0),
                            jnp.uint32(n_queries))
        visible = (slot <= first + query.astype(jnp.int32)) & (slot < key_end)
        for head in range(n_kv):
            scores = jax.lax.dot_general(
                q_ref[0, head], k_ref[0, :, head, :], (((1,), (1,)), ((), ())),
                preferred_element_type=jnp.float32) * (head_dim**-0.5)
            scores = jnp.where(visible, scores, MASK_VALUE)
            old_max = max_ref[head]
            new_max = jnp.maximum(old_max, jnp.max(scores, axis=-1, keepdims=True))
            probs = jnp.where(visible, jnp.exp(scores - new_max), 0.0)
            rescale = jnp.exp(old_max - new_max)
            sum_ref[head] = sum_ref[head] * rescale + jnp.sum(probs, axis=-1, keepdims=True)
            values = v_ref[0, :, head, :]
            acc_ref[head] = acc_ref[head] * rescale + jax.lax.dot_general(
                probs.astype(values.dtype), values, (((1,), (0,)), ((), ())),
                preferred_element_type=jnp.float32)
            max_ref[head] = new_max

    @pl.when(step == pl.num_programs(1) - 1)
    def _finish():
        total = sum_ref[...]
        out_ref[0] = (acc_ref[...] / jnp.where(total > 0, total, 1.0)).astype(out_ref.dtype)


def ragged_decode(q: jax.Array, k: jax.Array, v: jax.Array, key_end: jax.Array,
                  first_query_slot: jax.Array, *, interpret: bool,
                  key_block: int = RAGGED_KEY_BLOCK) -> jax.Array:
    """Attention of a decode step's queries q [B, K, G, C, Dh] over the sequence-major cache
    k, v [B, S, K, Dh] whose row b holds keys in its slots [0, key_end[b]) (the sampler's
    cache: no gaps; both per-row arguments int32 [B]): query c of row b sees those up to slot
    first_query_slot[b] + c. Returns [B, K, G, C, Dh] (a query that sees no key gets zeros),
    as `attention._decode_block` does, reading row b's key blocks only up to its
    `last_live_slot`. `interpret`: run the Pallas interpreter (off TPU)."""
    batch, n_kv, group, n_queries, head_dim = q.shape
    n_keys = k.shape[1]
    block = ragged_block_size(n_keys, key_block)
    n_rows = group * n_queries

    def live(b, i, first, end):
        return live_key_block(i, last_live_slot(first[b], end[b], n_queries), block)

    keys_spec = pl.BlockSpec((1, block, n_kv, head_dim),
                             lambda b, i, *ends: (b, live(b, i, *ends), 0, 0))
    rows_spec = pl.BlockSpec((1, n_kv, n_rows, head_dim), lambda b, i, *ends: (b, 0, 0, 0))
    stats = pltpu.VMEM((n_kv, n_rows, 1), jnp.float32)  # the running max, and sum, per query
    out = pl.pallas_call(
        functools.partial(_kernel, n_queries=n_queries, block=block, head_dim=head_dim),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(batch, n_keys // block),
            in_specs=[rows_spec, keys_spec, keys_spec], out_specs=rows_spec,
            scratch_shapes=[stats, stats, pltpu.VMEM((n_kv, n_rows, head_dim), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((batch, n_kv, n_rows, head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(first_query_slot, key_end, q.reshape(batch, n_kv, n_rows, head_dim), k, v)
    return out.reshape(q.shape)


def ragged_decode_sharded(q: jax.Array, k: jax.Array, v: jax.Array, key_end: jax.Array,
                          first_query_slot: jax.Array | int, *, interpret: bool) -> jax.Array:
    """`ragged_decode` in a `shard_map` over the context mesh, split as the sampler splits the
    cache (`sharding.kv_cache_axes`: rows over the batch axes, KV heads over 'tensor' where
    they divide it): a Pallas call is opaque to the SPMD partitioner, which would gather the
    whole cache onto every device. Without a mesh it runs whole."""
    run = functools.partial(ragged_decode, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    per_row = lambda a: jnp.broadcast_to(jnp.asarray(a, jnp.int32), q.shape[:1])  # noqa: E731
    key_end, first_query_slot = per_row(key_end), per_row(first_query_slot)
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return run(q, k, v, key_end, first_query_slot)
    rows, heads = kv_cache_axes(k.shape[2], mesh.shape)
    queries = fit_spec(P(rows, heads), q.shape, mesh)
    cache = fit_spec(P(rows, None, heads), k.shape, mesh)
    # check_vma=False: a Pallas call's outputs carry no varying-axes type; nothing inside
    # communicates
    return jax.shard_map(run, mesh=mesh, check_vma=False,
                         in_specs=(queries, cache, cache, P(cache[0]), P(cache[0])),
                         out_specs=queries)(q, k, v, key_end, first_query_slot)
