"""Meshes and parameter shardings over the axes ('data', 'fsdp', 'tensor'), and the bytes
each device holds of them.

Every parameter declares a logical PartitionSpec (NNX `sharding_names` metadata). A spec is
fitted to a concrete mesh by dropping any axis that does not divide the dimension it shards
(e.g. SmolLM2's 3 KV heads on a tensor axis of 4), so one model definition runs on any mesh.
"""

from __future__ import annotations

import dataclasses
import math

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the axes a batch (rows, tokens, KV-cache rows) is split over


def make_mesh(shape: tuple[int, int, int], devices=None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh laid along the hardware's links (`device_grid`);
    fails with an actionable message on a bad shape."""
    devices = list(devices if devices is not None else jax.devices())
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"mesh shape {shape} must be three positive ints (data, fsdp, tensor)")
    needed = int(np.prod(shape))
    if needed != len(devices):
        raise ValueError(
            f"mesh shape {tuple(shape)} needs {needed} devices but {len(devices)} are visible; "
            f"set mesh.data * mesh.fsdp * mesh.tensor = {len(devices)}"
        )
    return Mesh(device_grid(tuple(int(s) for s in shape), devices), MESH_AXES)


def device_grid(shape: tuple[int, int, int], devices: list) -> np.ndarray:
    """`devices` as a `shape` array whose neighbouring entries are linked devices.

    On one slice `mesh_utils.create_device_mesh` maps the axes onto the TPU torus (the last,
    most communicating axis on the fastest links; CPUs and GPUs keep their order). Devices on
    several slices (`slice_index`) get `create_hybrid_device_mesh`: the slices are split over
    'data' (only the gradient all-reduce crosses the data-centre network) or, when 'data' does
    not divide into them, over 'fsdp'.
    """
    if len(devices) == 1:
        return np.asarray(devices).reshape(shape)
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices == 1:
        return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    across = slice_axes(shape, slices)
    within = tuple(s // a for s, a in zip(shape, across, strict=True))
    return mesh_utils.create_hybrid_device_mesh(within, across, devices,
                                                allow_split_physical_axes=True)


def slice_axes(shape: tuple[int, int, int], slices: int) -> tuple[int, int, int]:
    """How many slices each mesh axis spans: all on 'data' if it divides, else on 'fsdp'."""
    data, fsdp, _ = shape
    if data % slices == 0:
        return slices, 1, 1
    if fsdp % slices == 0:
        return 1, slices, 1
    raise ValueError(f"mesh {tuple(shape)} cannot be split over {slices} slices: make mesh.data "
                     f"(best: only gradients cross slices) or mesh.fsdp a multiple of {slices}")


def traced_in_mesh(fn, mesh: Mesh):
    """`fn` traced with `mesh` as the context mesh, so `shard_map` inside it (the
    expert-parallel MoE layer) finds the mesh without it being threaded through the model."""
    def wrapped(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)
    return wrapped


def constrain(x: jax.Array, spec: PartitionSpec | tuple) -> jax.Array:
    """`x` held with sharding `spec` (less the axes that do not divide it) on the context mesh;
    unchanged outside one. Pins activations where XLA's propagation would pick a worse layout."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fit_spec(spec, x.shape, mesh)))


def fit_spec(spec: PartitionSpec | tuple, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Drop mesh axes from `spec` that do not divide the matching dimension of `shape`."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        fitted.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*fitted)


def kv_cache_axes(n_kv_heads: int, mesh_shape) -> tuple[tuple[str, ...], str | None]:
    """(batch axes, head axis) of a KV cache: heads over 'tensor' when they divide it, else the
    batch over 'tensor' too, so no device holds a replica (4 KV heads on tensor = 8 would
    otherwise copy the whole cache 8 times)."""
    if n_kv_heads % mesh_shape["tensor"] == 0:
        return BATCH_AXES, "tensor"
    return (*BATCH_AXES, "tensor"), None


def param_specs(state: nnx.State, mesh: Mesh) -> nnx.State:
    """PartitionSpecs of every parameter in `state`, fitted to `mesh`."""
    logical = nnx.get_partition_spec(state)
    return jax.tree.map(
        lambda spec, value: fit_spec(spec, value.shape, mesh),
        logical,
        state,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def param_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """NamedShardings of every parameter in `state` on `mesh`."""
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        param_specs(state, mesh),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def per_device_bytes(tree) -> int:
    """Bytes one device holds of a tree of arrays or ShapeDtypeStructs with shardings (the
    largest shard of each)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
               for x in jax.tree.leaves(tree))


# The TPU compiler's option for HBM that arrays outside the program hold: it then keeps the
# program within the rest (untold, it plans each program for the whole HBM).
TPU_RESERVED_HBM_OPTION = "xla_tpu_user_reserved_hbm_bytes"


def reserved_memory_options(mesh: Mesh | AbstractMesh, reserved_bytes: int) -> dict:
    """XLA compiler options for a program on `mesh` that runs beside `reserved_bytes` per
    device of other arrays: the TPU compiler's reservation; nothing on other platforms (or an
    abstract mesh, which has no devices to compile for)."""
    platform = mesh.devices.flat[0].platform if isinstance(mesh, Mesh) else None
    if platform == "tpu" and reserved_bytes > 0:
        return {TPU_RESERVED_HBM_OPTION: int(reserved_bytes)}
    return {}


@dataclasses.dataclass(frozen=True)
class ResidentBytes:
    """Per-device bytes that stay in HBM through both phases of a cycle, and so beside each
    phase's programs: the master weights, the AdamW state, the sampler's own copy of the
    weights in the compute dtype (0 when it shares the masters) and KL's frozen reference
    copy (0 without KL)."""

    masters: int
    optimizer: int
    sampler_copy: int
    reference: int

    @classmethod
    def of(cls, params, opt_state, compute_dtype, kl: bool) -> ResidentBytes:
        """The resident bytes of a train state's `params` and `opt_state` (arrays or
        ShapeDtypeStructs with shardings) with weight copies in `compute_dtype`."""
        dtype = jnp.dtype(compute_dtype)
        copy = sum(math.prod(x.sharding.shard_shape(x.shape))
                   * (dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype).itemsize
                   for x in jax.tree.leaves(params))
        masters = per_device_bytes(params)
        own_copy = any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype
                       for x in jax.tree.leaves(params))
        return cls(masters=masters, optimizer=per_device_bytes(opt_state),
                   sampler_copy=copy if own_copy else 0, reference=copy if kl else 0)

    @property
    def beside_sampler(self) -> int:
        """What the sampler's programs run beside: the optimizer state, KL's copy and the
        masters (which are the sampler's own weights, its arguments, when it has no copy)."""
        return self.optimizer + self.reference + (self.masters if self.sampler_copy else 0)

    @property
    def beside_train_step(self) -> int:
        """What the train step runs beside: the sampler's copy (the masters, the optimizer
        state and KL's copy are its arguments)."""
        return self.sampler_copy
