"""Qwen3-MoE mixture of experts: routing, the routed dropless layer and its dense reference.

`moe_mlp` (the model's path) sorts each token's top-k copies by expert, runs every projection
as one grouped matmul (`jax.lax.ragged_dot`) over the experts, un-sorts and sums the k copies
weighted by the router. Under a mesh with a 'tensor' axis (the expert axis: w_gate/w_up
[E, D, F] are sharded (tensor, fsdp, None), w_down [E, F, D] (tensor, None, fsdp)) it runs
in a `shard_map`: each rank computes only the copies routed to its E/tp experts and one psum
over 'tensor' combines them. Dispatch is an all-gather that costs nothing: tokens are already
replicated over 'tensor' (sharded over data and fsdp only), so the combine is the same single
[tokens, D] all-reduce the dense layer needed, where a ragged all-to-all would add two
exchanges of the k copies for no saving at this layout.
Dropless means a rank's buffer has room for the worst case, every local token sending
min(k, E/tp) copies to it; rows past the real count are zeros of the grouped matmul.
`moe_mlp_dense` runs every expert on every token (E/k times the FLOPs) and is the reference
the tests compare against. The megablox GMM Pallas kernel is not used: `ragged_dot` lowers to
XLA's native ragged dot on TPU and GPU; on CPU JAX expands it to a masked dense product.
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


def expert_load(top_idx: jax.Array, n_experts: int) -> dict[str, jax.Array]:
    """Load-balance statistics of a routing: copies per expert [E] and their max / mean."""
    counts = jnp.sum(jax.nn.one_hot(top_idx.reshape(-1), n_experts, dtype=jnp.int32), axis=0)
    return {"tokens_per_expert": counts,
            "expert_load_max_over_mean": jnp.max(counts) * n_experts / top_idx.size}


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
    hidden = (jax.nn.silu(jax.lax.ragged_dot(x_sorted, gate, group_sizes))
              * jax.lax.ragged_dot(x_sorted, up, group_sizes))
    out_sorted = jax.lax.ragged_dot(hidden, down, group_sizes)  # zero past sum(group_sizes)
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
