"""Qwen3-MoE mixture of experts: routing, the routed dropless layer and its dense reference.

`moe_mlp` (the model's path) sorts each token's top-k copies by expert, runs every projection
as one grouped matmul (`grouped_matmul`) over the experts, un-sorts and sums the k copies
weighted by the router. Under a mesh with a 'tensor' axis (the expert axis: w_gate/w_up
[E, D, F] are sharded (tensor, fsdp, None), w_down [E, F, D] (tensor, None, fsdp)) it runs
in a `shard_map`: each rank computes only the copies routed to its E/tp experts and one psum
over 'tensor' combines them. Dispatch is an all-gather that costs nothing: tokens are already
replicated over 'tensor' (sharded over data and fsdp only), so the combine is the same single
[tokens, D] all-reduce the dense layer needed, where a ragged all-to-all would add two
exchanges of the k copies for no saving at this layout.
Dropless means a rank's buffer has room for the worst case, every local token sending
min(k, E/tp) copies to it; rows past the real count are zeros of the grouped matmul (a static
program, as XLA's cost analysis counts it, does that worst case: up to tp x the balanced work).
`moe_mlp_dense` runs every expert on every token (E/k times the FLOPs) and is the reference
the tests compare against. `grouped_matmul` is `jax.lax.ragged_dot` on TPU and GPU (XLA's native
ragged dot; the megablox GMM Pallas kernel is not used, it was not tested here) and
`tiled_grouped_matmul` on CPU, where JAX expands `ragged_dot` into a masked product of every
row with every expert (k times the dense layer's FLOPs when k <= E/tp).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

EXPERT_AXIS = "tensor"
TOKEN_AXES = ("data", "fsdp")


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


def _tile_rows(n_rows: int, n_groups: int) -> int:
    """Rows per tile of `tiled_grouped_matmul`: padding (< a tile per group) stays within a
    quarter of the rows, tiles between 8 and 512 rows."""
    tile = 8
    while tile < 512 and tile * 2 * n_groups * 4 <= n_rows:
        tile *= 2
    return tile


def tiled_grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """`jax.lax.ragged_dot(lhs [M, I], rhs [G, I, O], group_sizes [G])` as tiles of one group.

    Each group's rows are padded to whole tiles (static count: M/tile + G) and every tile is
    multiplied by its group's matrix, one batched matmul: about M x I x O multiply-adds plus
    the padding, where JAX's CPU lowering of `ragged_dot` multiplies every row by all G
    matrices. Rows past sum(group_sizes) give zeros, as in `ragged_dot`.
    """
    n_rows, n_groups = lhs.shape[0], rhs.shape[0]
    tile = _tile_rows(n_rows, n_groups)
    n_tiles = -(-n_rows // tile) + n_groups
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


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Grouped matmul: XLA's ragged dot on TPU and GPU, `tiled_grouped_matmul` on CPU."""
    return jax.lax.platform_dependent(
        lhs, rhs, group_sizes, cpu=tiled_grouped_matmul,
        default=lambda a, b, g: jax.lax.ragged_dot(a, b, g))


def _local_experts(x, top_idx, top_vals, gate, up, down, first_expert):
    """Routed SwiGLU of tokens x [N, D] over the experts gate/up [G, D, F], down [G, F, D].

    The local experts are global ids first_expert .. first_expert + G - 1; copies routed
    elsewhere contribute zero. Returns [N, D] in x's dtype.
    """
    n_tokens, top_k = top_idx.shape
    n_local = gate.shape[0]
    local_id = top_idx.reshape(-1) - first_expert  # [N*k], token-major copies
    is_local = (local_id >= 0) & (local_id < n_local)
    sort_key = jnp.where(is_local, local_id, n_local)  # copies for other ranks sort last
    order = jnp.argsort(sort_key, stable=True)
    capacity = n_tokens * min(top_k, n_local)  # dropless: at most this many local copies
    rows = order[:capacity]
    group_sizes = jnp.sum(jax.nn.one_hot(sort_key, n_local, dtype=jnp.int32), axis=0)
    x_sorted = jnp.take(x, rows // top_k, axis=0)  # [capacity, D]
    hidden = (jax.nn.silu(grouped_matmul(x_sorted, gate, group_sizes))
              * grouped_matmul(x_sorted, up, group_sizes))
    out_sorted = grouped_matmul(hidden, down, group_sizes)  # zero past sum(group_sizes)
    # un-sort: copy c sits at position inverse[c] of the sorted order; beyond the buffer it
    # is another rank's copy and reads the appended zero row
    inverse = jnp.argsort(order)
    padded = jnp.concatenate([out_sorted, jnp.zeros((1, x.shape[-1]), out_sorted.dtype)])
    copies = jnp.take(padded, jnp.minimum(inverse, capacity), axis=0)
    weights = jnp.where(is_local, top_vals.reshape(-1), 0.0).astype(x.dtype)
    return jnp.sum((copies * weights[:, None]).reshape(n_tokens, top_k, -1), axis=1)


def _token_spec(n_tokens: int, mesh) -> PartitionSpec:
    """Tokens over ('data', 'fsdp') where they divide evenly, else replicated."""
    size = math.prod(mesh.shape[a] for a in TOKEN_AXES)
    return PartitionSpec(TOKEN_AXES if n_tokens % size == 0 else None, None)


def moe_mlp(
    x: jax.Array, router: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array,
    top_k: int, normalise: bool,
) -> jax.Array:
    """Routed dropless mixture of experts on x [B, T, D]; equal to `moe_mlp_dense`.

    Expert-parallel over 'tensor' when the abstract mesh in context (`jax.set_mesh`) has the
    ('data', 'fsdp', 'tensor') axes and 'tensor' divides the expert count; otherwise one
    routed computation over all experts, left to the SPMD partitioner.
    """
    batch, length, d_model = x.shape
    flat = x.reshape(batch * length, d_model)
    top_idx, top_vals = route(flat, router, top_k, normalise)
    mesh = jax.sharding.get_abstract_mesh()
    n_experts = gate.shape[0]
    expert_parallel = (set(mesh.axis_names) == {*TOKEN_AXES, EXPERT_AXIS}
                       and mesh.shape[EXPERT_AXIS] > 1 and n_experts % mesh.shape[EXPERT_AXIS] == 0)
    if not expert_parallel:
        out = _local_experts(flat, top_idx, top_vals, gate, up, down, 0)
        return out.reshape(x.shape)

    n_local = n_experts // mesh.shape[EXPERT_AXIS]

    def shard(x, top_idx, top_vals, gate, up, down):
        # Mark the tokens as varying over the expert axis before the rank-dependent gathers:
        # left implicit, JAX 0.10 drops the psum of their gradient over 'tensor'.
        x, top_vals = jax.lax.pcast((x, top_vals), EXPERT_AXIS, to="varying")
        first = jax.lax.axis_index(EXPERT_AXIS) * n_local
        partial = _local_experts(x, top_idx, top_vals, gate, up, down, first)
        return jax.lax.psum(partial, EXPERT_AXIS)

    tokens = _token_spec(flat.shape[0], mesh)
    experts = PartitionSpec(EXPERT_AXIS, None, None)  # gathered over fsdp on entry (ZeRO-3)
    out = jax.shard_map(shard, mesh=mesh, in_specs=(tokens, tokens, tokens, experts, experts,
                                                    experts), out_specs=tokens)(
        flat, top_idx, top_vals, gate, up, down)
    return out.reshape(x.shape)
