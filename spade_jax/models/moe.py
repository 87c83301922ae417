"""Qwen3-MoE mixture of experts: routing, the routed layer (dropless or with a capacity) and
its dense reference.

`moe_mlp` (the model's path) sorts each token's top-k copies by expert, runs every projection
as one grouped matmul (`grouped_matmul`) over the experts, un-sorts and sums the k copies
weighted by the router. Under a mesh with a 'tensor' axis it runs in a `shard_map`, the
weights split as `MoeSharding` says: by expert (w_gate/w_up [E, D, F] sharded (tensor, fsdp,
None), w_down [E, F, D] (tensor, None, fsdp)), each rank computing only the copies routed to
its E/tp experts; or by hidden column (FFN: (None, fsdp, tensor) and (None, tensor, fsdp)),
each rank computing every copy on its F/tp columns. One psum over 'tensor' combines them.
Dispatch is an all-gather that costs nothing: tokens are already replicated over 'tensor'
(sharded over data and fsdp only), so the combine is the same single [tokens, D] all-reduce
the dense layer needed, where a ragged all-to-all would add two exchanges of the k copies for
no saving at this layout.
Each rank's grouped-matmul buffer is static (`buffer_rows`). FFN-split (the default, as
MaxText and Tunix split experts over their tensor axis) it holds exactly the tokens' N·k
copies. Expert-split and dropless it has room for the worst case,
every local token sending min(k, E/tp) copies to the rank: up to tp x the balanced work in
XLA's cost analysis of the static program. So that this worst case is a bounded buffer rather
than one of all the rank's tokens (a 30B prefill's 74k tokens x 8 copies per rank, tens of
GiB), dropless ranks route their tokens in chunks of `MOE_TOKEN_CHUNK`, one after the other
(`_chunked_local_experts`, each chunk rematerialised in the backward pass): the same outputs,
the worst-case buffer of one chunk (XLA's cost analysis counts one chunk). At run time on TPU
the megablox kernel visits only the tiles of real rows (a dynamic grid) yet declares the whole
buffer's FLOPs to XLA; on CPU (`tiled_grouped_matmul`) the buffer is really multiplied. With
`model.moe_capacity_factor` c the buffer holds c x the balanced share N·k/tp and a rank's
copies past it are dropped (the latest tokens' first; the token keeps its residual stream), as
MaxText's and Tunix's capacity factor does; `RouterLoad` reports the copies per expert and the
dropped ones. Drops differ between the sampler's and the trainer's token sets, so a capacity
factor trades the FLOPs of the worst case for a model that is not exactly the checkpoint's.
`moe_mlp_dense` runs every expert on every token (E/k times the FLOPs) and is the reference
the tests compare against. `grouped_matmul` is the megablox GMM Pallas kernel on TPU and
`tiled_grouped_matmul` elsewhere. JAX expands `ragged_dot` on CPU into a masked product of
every row with every expert (G times the FLOPs), and on an H200 XLA's `ragged_dot` ran a
30B-A3B layer slower than the dense reference. `bench/moe.py` times each grouped matmul
against dense; launch/gpu/README.md holds the measurement.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from spade_jax.sharding import BATCH_AXES

EXPERT_AXIS = "tensor"


class MoeSharding(enum.StrEnum):
    """`model.moe_sharding`: how the experts' weights split over the mesh's 'tensor' axis.

    FFN (the default; tensor-parallel experts, the layout MaxText and Tunix give their tensor
    axis): each rank holds every expert's F/tp hidden columns and computes all its tokens'
    copies on them, so the buffer is exactly N·k rows and every rank does the same work, in
    matmuls tp times narrower. EXPERTS (expert parallelism): each rank holds E/tp whole
    experts and computes the copies routed to them; its static buffer must hold the worst
    case (dropless: every local token's min(k, E/tp) copies), up to tp x the balanced work in
    XLA's cost analysis and, where the grouped matmul cannot skip empty tiles (CPU, GPU), at
    run time; the most loaded rank sets the pace. Both end in one psum of [tokens, D] over
    'tensor'.
    """

    EXPERTS = "experts"
    FFN = "ffn"

    def weight_axes(self) -> tuple[tuple, tuple]:
        """Mesh axes of the stacked [L, E, D, F] gate/up and [L, E, F, D] down weights."""
        if self is MoeSharding.EXPERTS:
            return (None, EXPERT_AXIS, "fsdp", None), (None, EXPERT_AXIS, None, "fsdp")
        return (None, None, "fsdp", EXPERT_AXIS), (None, None, EXPERT_AXIS, "fsdp")

    def splits(self, n_experts: int, ffn_dim: int, n_ranks: int) -> bool:
        """Whether 'tensor' (n_ranks) divides the split dimension (else no tensor parallelism)."""
        split = n_experts if self is MoeSharding.EXPERTS else ffn_dim
        return n_ranks > 1 and split % n_ranks == 0

    def expert_ranks(self, n_experts: int, ffn_dim: int, n_ranks: int) -> int:
        """How many ranks the experts are divided among: all n_ranks under EXPERTS when they
        split it, else 1 (FFN ranks each hold every expert)."""
        split = self is MoeSharding.EXPERTS and self.splits(n_experts, ffn_dim, n_ranks)
        return n_ranks if split else 1

    def rank_specs(self) -> tuple[PartitionSpec, PartitionSpec]:
        """`shard_map` specs of one layer's gate/up [E, D, F] and down [E, F, D] (gathered over
        fsdp on entry, ZeRO-3)."""
        if self is MoeSharding.EXPERTS:
            return (PartitionSpec(EXPERT_AXIS, None, None),) * 2
        return PartitionSpec(None, None, EXPERT_AXIS), PartitionSpec(None, EXPERT_AXIS, None)


def route(x: jax.Array, router: jax.Array, top_k: int, normalise: bool):
    """Qwen3-MoE routing of x [..., D]: (expert ids [..., k] int32, weights [..., k] float32).

    Softmax over experts in float32, keep the top-k, optionally renormalise them to sum to 1.
    """
    logits = (x @ router).astype(jnp.float32)
    top_vals, top_idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    if normalise:
        top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
    return top_idx.astype(jnp.int32), top_vals


def router_weights(x: jax.Array, router: jax.Array, top_k: int, normalise: bool) -> jax.Array:
    """Dense per-expert weights [..., E], zero outside each token's top-k (see `route`)."""
    top_idx, top_vals = route(x, router, top_k, normalise)
    one_hot = jax.nn.one_hot(top_idx, router.shape[-1], dtype=jnp.float32)  # [..., k, E]
    return jnp.einsum("...k,...ke->...e", top_vals, one_hot)


def moe_mlp_dense(
    x: jax.Array, router: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array,
    top_k: int, normalise: bool,
) -> jax.Array:
    """Reference mixture of experts: every expert runs on every token, weighted by routing."""
    weights = router_weights(x, router, top_k, normalise).astype(x.dtype)  # [B, T, E]
    hidden = jax.nn.silu(jnp.einsum("btd,edf->btef", x, gate)) * jnp.einsum(
        "btd,edf->btef", x, up
    )
    expert_out = jnp.einsum("btef,efd->bted", hidden, down)
    return jnp.einsum("bted,bte->btd", expert_out, weights)


TILE_GATHER_ROWS = 64  # what gathering a tile's weight matrix costs, in rows of its matmul


def tile_count(n_rows: int, n_groups: int, tile: int) -> int:
    """Static tile count of `tiled_grouped_matmul`: each group pads to whole tiles (< a tile
    of padding per group)."""
    return -(-(n_rows + n_groups * (tile - 1)) // tile)


def tile_rows(n_rows: int, n_groups: int) -> int:
    """Rows per tile of `tiled_grouped_matmul`: the power of two from 8 to 512 with the least
    tile_count x (tile + TILE_GATHER_ROWS), since every static tile multiplies its rows
    (padding included) and gathers its group's weight matrix, which on CPU costs about as much
    as TILE_GATHER_ROWS rows of its matmul (measured by `python bench/moe.py --tile-sweep`). 1
    (no padding) when there are no more rows than groups (a small decode step)."""
    if n_rows <= n_groups:
        return 1
    return min((8 << i for i in range(7)),
               key=lambda tile: tile_count(n_rows, n_groups, tile) * (tile + TILE_GATHER_ROWS))


def tiled_grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`jax.lax.ragged_dot(lhs [M, I], rhs [G, I, O], group_sizes [G])` as tiles of one group.

    Each group's rows are padded to whole tiles (static count: (M + G(tile-1))/tile) and
    every tile is multiplied by its group's matrix, one batched matmul: about M x I x O
    multiply-adds plus the padding, where JAX's CPU lowering of `ragged_dot` multiplies every
    row by all G matrices. Rows past sum(group_sizes) give zeros, as in `ragged_dot`.
    """
    n_rows, n_groups = lhs.shape[0], rhs.shape[0]
    tile = tile_rows(n_rows, n_groups)
    n_tiles = tile_count(n_rows, n_groups, tile)
    ends = jnp.cumsum(group_sizes)
    padded = -(-group_sizes // tile) * tile
    padded_ends = jnp.cumsum(padded)
    row = jnp.arange(n_rows)
    group = jnp.minimum(jnp.searchsorted(ends, row, side="right"), n_groups - 1)
    in_group = row < ends[-1]
    offset = row - (ends - group_sizes)[group]  # position within its group
    dest = jnp.where(in_group, padded_ends[group] - padded[group] + offset,
                     n_tiles * tile)  # rows past the groups go nowhere (dropped)
    tiles = jnp.zeros((n_tiles * tile, lhs.shape[1]), lhs.dtype).at[dest].set(lhs, mode="drop")
    tile_group = jnp.minimum(jnp.searchsorted(padded_ends, jnp.arange(n_tiles) * tile,
                                              side="right"), n_groups - 1)
    out = jnp.einsum("tmi,tio->tmo", tiles.reshape(n_tiles, tile, -1), rhs[tile_group])
    # rows past the groups read the last row, which padding never reaches: zeros
    return jnp.take(out.reshape(n_tiles * tile, -1), jnp.minimum(dest, n_tiles * tile - 1), axis=0)


MEGABLOX_TILE = 128  # megablox GMM (m, k, n) tile: the TPU's 128 lanes


def megablox_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """The (m, k, n) tile of each megablox problem: 128 a side, or the whole dimension when it
    is narrower (FFN-split experts: 96 columns for 30B-A3B at tensor 8). Given as a function,
    the kernel's backward pass sizes its own transposed problems' tiles (a fixed tuple would
    put the forward's 96-wide tile on the 2048-wide dimension, which Mosaic refuses)."""
    del m
    return MEGABLOX_TILE, min(MEGABLOX_TILE, k), min(MEGABLOX_TILE, n)


def megablox_grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                            interpret: bool = False) -> jax.Array:
    """`ragged_dot` as the megablox GMM Pallas kernel (TPU; `interpret=True` runs it anywhere).

    Rows are padded to whole 128-row tiles. Unlike `ragged_dot`, rows past sum(group_sizes)
    are left unwritten (garbage), so callers mask them (as `_local_experts` does).
    """
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

    n_rows = lhs.shape[0]
    extra = -n_rows % MEGABLOX_TILE
    out = megablox.gmm(jnp.pad(lhs, ((0, extra), (0, 0))), rhs, group_sizes.astype(jnp.int32),
                       lhs.dtype, megablox_tiling, None, None, False, interpret)
    return out[:n_rows]


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Grouped matmul by platform: megablox GMM on TPU, `tiled_grouped_matmul` on CPU and GPU
    (see the module docstring for why not XLA's `ragged_dot`). Rows past sum(group_sizes) are
    unspecified."""
    return jax.lax.platform_dependent(
        lhs, rhs, group_sizes, tpu=megablox_grouped_matmul, default=tiled_grouped_matmul)


class RouterLoad(NamedTuple):
    """A MoE layer's routing statistics: `expert_copies` [E] float32, the token copies the
    router sent to each expert, and `dropped` [] float32, the copies that found no room in
    their rank's buffer (always 0 when dropless) and so contribute nothing."""

    expert_copies: jax.Array
    dropped: jax.Array


def load_metrics(load: RouterLoad) -> dict[str, jax.Array]:
    """Scalar metrics of a `RouterLoad` with leading axes (e.g. [layers, E]): the worst
    layer's max/mean copies per expert (1 = balanced, E/k = every token on the same k
    experts) and the fraction of all copies dropped for capacity."""
    copies = load.expert_copies
    per_layer = jnp.max(copies, axis=-1) / jnp.maximum(jnp.mean(copies, axis=-1), 1e-9)
    return {"router_max_over_mean_load": jnp.max(per_layer),
            "router_dropped_fraction": jnp.sum(load.dropped) / jnp.maximum(jnp.sum(copies), 1.0)}


def buffer_rows(n_tokens: int, top_k: int, n_local: int, n_ranks: int,
                capacity_factor: float | None) -> int:
    """Rows of one rank's grouped-matmul buffer for `n_tokens` tokens.

    Dropless (None): the worst case, every token sending min(k, n_local) copies to this rank.
    With a capacity factor: that factor times the balanced share n_tokens·k/n_ranks (rounded
    up), never more than the worst case. XLA's static cost analysis counts the whole buffer.
    """
    worst = n_tokens * min(top_k, n_local)
    if capacity_factor is None:
        return worst
    if not capacity_factor > 0:
        raise ValueError(f"moe_capacity_factor={capacity_factor!r} must be > 0 (or None for "
                         "dropless)")
    return min(worst, max(1, math.ceil(capacity_factor * n_tokens * top_k / n_ranks)))


def _local_experts(x, top_idx, top_vals, gate, up, down, first_expert, capacity):
    """Routed SwiGLU of tokens x [N, D] over the experts gate/up [G, D, F], down [G, F, D].

    The local experts are global ids first_expert .. first_expert + G - 1; copies routed
    elsewhere contribute zero. At most `capacity` local copies run, the earliest tokens' first
    (as MaxText drops the latest); the rest are dropped. Returns ([N, D] in x's dtype, the
    number of dropped copies).
    """
    n_tokens, top_k = top_idx.shape
    n_local = gate.shape[0]
    local_id = top_idx.reshape(-1) - first_expert  # [N*k], token-major copies
    is_local = (local_id >= 0) & (local_id < n_local)
    kept = is_local & (jnp.cumsum(is_local) <= capacity)
    sort_key = jnp.where(kept, local_id, n_local)  # dropped and other ranks' copies sort last
    order = jnp.argsort(sort_key, stable=True)
    rows = order[:capacity]
    group_sizes = jnp.sum(jax.nn.one_hot(sort_key, n_local, dtype=jnp.int32), axis=0)
    n_kept = jnp.sum(group_sizes)
    # Rows past the kept copies: the megablox kernel leaves them unwritten, in its output and
    # in its backward pass's lhs gradient; this `where` keeps the latter from reaching x, and
    # the un-sort below never reads the former.
    row_valid = (jnp.arange(capacity) < n_kept)[:, None]
    x_sorted = jnp.where(row_valid, jnp.take(x, rows // top_k, axis=0), 0)  # [capacity, D]
    hidden = (jax.nn.silu(grouped_matmul(x_sorted, gate, group_sizes))
              * grouped_matmul(x_sorted, up, group_sizes))
    out_sorted = grouped_matmul(hidden, down, group_sizes)
    # un-sort: copy c sits at position inverse[c] of the sorted order; a copy not kept here
    # (dropped, or another rank's) reads the appended zero row
    inverse = jnp.where(kept, jnp.argsort(order), capacity)
    padded = jnp.concatenate([out_sorted, jnp.zeros((1, x.shape[-1]), out_sorted.dtype)])
    copies = jnp.take(padded, inverse, axis=0)
    weights = jnp.where(kept, top_vals.reshape(-1), 0.0).astype(x.dtype)
    out = jnp.sum((copies * weights[:, None]).reshape(n_tokens, top_k, -1), axis=1)
    return out, (jnp.sum(is_local) - n_kept).astype(jnp.float32)


MOE_TOKEN_CHUNK = 4096  # tokens a dropless rank routes at once: a worst-case buffer of 32k rows


def _chunked_local_experts(x, top_idx, top_vals, gate, up, down, first_expert, chunk):
    """Dropless `_local_experts` of tokens x [N, D] routed `chunk` tokens at a time.

    Each chunk gets its own worst-case buffer (chunk x min(k, G) rows) and runs after the
    previous one (`lax.map`), its intermediates rematerialised in the backward pass
    (`jax.checkpoint`), so the buffers are one chunk's whatever N is. The last chunk is padded
    with tokens routed to expert -1, which no rank holds: they contribute nothing. Same
    (output, dropped = 0) as one dropless call over all N tokens.
    """
    n_tokens, top_k = top_idx.shape
    worst = lambda n: buffer_rows(n, top_k, gate.shape[0], 1, None)  # noqa: E731
    if n_tokens <= chunk:
        return _local_experts(x, top_idx, top_vals, gate, up, down, first_expert,
                              worst(n_tokens))
    n_chunks = -(-n_tokens // chunk)
    pad = n_chunks * chunk - n_tokens
    chunks = (jnp.pad(x, ((0, pad), (0, 0))).reshape(n_chunks, chunk, -1),
              jnp.pad(top_idx, ((0, pad), (0, 0)), constant_values=-1).reshape(
                  n_chunks, chunk, top_k),
              jnp.pad(top_vals, ((0, pad), (0, 0))).reshape(n_chunks, chunk, top_k))

    @jax.checkpoint
    def one_chunk(args):
        return _local_experts(*args, gate, up, down, first_expert, worst(chunk))

    out, dropped = jax.lax.map(one_chunk, chunks)
    return out.reshape(n_chunks * chunk, -1)[:n_tokens], jnp.sum(dropped)


def tokens_split(n_tokens: int, mesh_shape) -> bool:
    """Whether the expert-parallel layer splits its `n_tokens` over ('data', 'fsdp'): where
    they divide evenly; otherwise every rank routes them all. `mesh_shape`: axis -> size."""
    return n_tokens % math.prod(mesh_shape.get(a, 1) for a in BATCH_AXES) == 0


def _token_spec(n_tokens: int, mesh) -> PartitionSpec:
    return PartitionSpec(BATCH_AXES if tokens_split(n_tokens, dict(mesh.shape)) else None, None)


def _rank_experts(x, top_idx, top_vals, gate, up, down, first_expert, *, n_ranks,
                  capacity_factor):
    """One rank's routed experts over its tokens x [N, D]: dropless in token chunks
    (`_chunked_local_experts`), or one buffer of `buffer_rows` at a capacity factor."""
    if capacity_factor is None:
        return _chunked_local_experts(x, top_idx, top_vals, gate, up, down, first_expert,
                                      MOE_TOKEN_CHUNK)
    capacity = buffer_rows(x.shape[0], top_idx.shape[1], gate.shape[0], n_ranks,
                           capacity_factor)
    return _local_experts(x, top_idx, top_vals, gate, up, down, first_expert, capacity)


def moe_mlp(
    x: jax.Array, router: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array,
    top_k: int, normalise: bool, capacity_factor: float | None = None,
    sharding: MoeSharding = MoeSharding.FFN,
) -> tuple[jax.Array, RouterLoad]:
    """Routed mixture of experts on x [B, T, D]: (output, its `RouterLoad`).

    Dropless (`capacity_factor` None) it equals `moe_mlp_dense`. Tensor-parallel over 'tensor'
    as `sharding` says when the abstract mesh in context (`jax.set_mesh`) has the ('data',
    'fsdp', 'tensor') axes and 'tensor' divides the split dimension; otherwise one routed
    computation over all experts, left to the SPMD partitioner. Each rank's buffer holds
    `buffer_rows` copies of its tokens (dropless: of one chunk of `MOE_TOKEN_CHUNK` tokens at
    a time).
    """
    batch, length, d_model = x.shape
    flat = x.reshape(batch * length, d_model)
    top_idx, top_vals = route(flat, router, top_k, normalise)
    n_experts = gate.shape[0]
    expert_copies = jnp.sum(jax.nn.one_hot(top_idx.reshape(-1), n_experts, dtype=jnp.float32),
                            axis=0)
    mesh = jax.sharding.get_abstract_mesh()
    parallel = (set(mesh.axis_names) == {*BATCH_AXES, EXPERT_AXIS}
                and sharding.splits(n_experts, gate.shape[-1], mesh.shape[EXPERT_AXIS]))
    if not parallel:
        out, dropped = _rank_experts(flat, top_idx, top_vals, gate, up, down, 0, n_ranks=1,
                                     capacity_factor=capacity_factor)
        return out.reshape(x.shape), RouterLoad(expert_copies, dropped)

    tp = mesh.shape[EXPERT_AXIS]
    tokens = _token_spec(flat.shape[0], mesh)
    by_experts = sharding is MoeSharding.EXPERTS
    n_local = n_experts // sharding.expert_ranks(n_experts, gate.shape[-1], tp)
    # ranks that drop different copies: expert ranks split the copies; FFN ranks repeat them
    drop_axes = ((*BATCH_AXES,) if tokens[0] else ()) + ((EXPERT_AXIS,) if by_experts else ())

    def shard(x, top_idx, top_vals, gate, up, down):
        first = jax.lax.axis_index(EXPERT_AXIS) * n_local if by_experts else 0
        partial, dropped = _rank_experts(x, top_idx, top_vals, gate, up, down, first,
                                         n_ranks=tp if by_experts else 1,
                                         capacity_factor=capacity_factor)
        return (jax.lax.psum(partial, EXPERT_AXIS),
                jax.lax.psum(dropped, drop_axes) if drop_axes else dropped)

    gate_spec, down_spec = sharding.rank_specs()
    # check_vma=False: the megablox kernel's outputs carry no varying-axes type (JAX refuses
    # to trace it otherwise, on every platform, as platform_dependent traces each branch);
    # the gradients are checked against the dense layer in tests/models/test_moe.py.
    out, dropped = jax.shard_map(
        shard, mesh=mesh,
        in_specs=(tokens, tokens, tokens, gate_spec, gate_spec, down_spec),
        out_specs=(tokens, PartitionSpec()), check_vma=False)(
        flat, top_idx, top_vals, gate, up, down)
    return out.reshape(x.shape), RouterLoad(expert_copies, dropped)
