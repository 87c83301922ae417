"""Build a sharded `Transformer` from HF-named tensors, leaf by leaf, without a full host copy.

The model is first created abstractly (`nnx.eval_shape`), its shardings come from the
parameter specs fitted to the mesh, and every leaf is made with `jax.make_array_from_callback`:
each device's callback reads only its own block from the checkpoint. Shapes are checked
against the config before anything is read, so a mismatched checkpoint fails with a message
naming the tensor instead of a reshape error inside JAX.
"""

from __future__ import annotations

import itertools
from typing import Protocol

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from spade_jax.errors import CheckpointError
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.sharding import make_mesh, param_shardings
from spade_jax.weights.hf_layout import LeafLayout, leaf_layouts


class TensorSource(Protocol):
    """Read access to HF-named tensors (a safetensors checkpoint or dequantised GGUF)."""

    def keys(self) -> set[str]: ...

    def shape(self, key: str) -> tuple[int, ...]: ...

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray: ...


class ArraySource:
    """A `TensorSource` over in-memory numpy arrays (used for GGUF and in tests)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self._arrays = arrays

    def keys(self) -> set[str]:
        return set(self._arrays)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._arrays[key].shape)

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        return self._arrays[key][slices]


def check_source(cfg: ModelConfig, source: TensorSource, where: str) -> None:
    """Raise CheckpointError if a tensor the config needs is missing or has the wrong shape."""
    available = source.keys()
    missing, wrong = [], []
    for layout in leaf_layouts(cfg).values():
        for _, key in layout.keys(cfg):
            if key not in available:
                missing.append(key)
            elif source.shape(key) != layout.hf_shape:
                wrong.append(f"{key}: checkpoint {source.shape(key)}, config {layout.hf_shape}")
    if missing or wrong:
        problems = [f"missing tensors ({len(missing)}): {', '.join(missing[:5])}"] * bool(missing)
        problems += [f"shape mismatches ({len(wrong)}): {'; '.join(wrong[:5])}"] * bool(wrong)
        raise CheckpointError(
            f"{where} does not match its model config ({'; '.join(problems)}). Check that "
            "config.json belongs to these weights, or that the architecture fields are right."
        )


def _leaf_array(
    layout: LeafLayout, cfg: ModelConfig, source: TensorSource, abstract, sharding, dtype
) -> jax.Array:
    n_stacked = len(layout.stacked)
    keys = dict(layout.keys(cfg))

    def read_shard(index: tuple[slice, ...]) -> np.ndarray:
        index = tuple(
            slice(*s.indices(dim)[:2]) for s, dim in zip(index, abstract.shape, strict=True)
        )
        stack_ranges = [range(s.start, s.stop) for s in index[:n_stacked]]
        blocks = [
            layout.read_block(source.read, keys[stack_index], index[n_stacked:])
            for stack_index in itertools.product(*stack_ranges)
        ]
        counts = [len(r) for r in stack_ranges]
        stacked = np.stack(blocks) if n_stacked else blocks[0]
        return np.asarray(stacked, dtype=dtype).reshape(counts + list(blocks[0].shape))

    return jax.make_array_from_callback(abstract.shape, sharding, read_shard)


def load_model(
    cfg: ModelConfig,
    source: TensorSource,
    *,
    mesh: Mesh | None = None,
    param_dtype=jnp.float32,
    where: str = "checkpoint",
) -> Transformer:
    """A `Transformer(cfg)` whose parameters are read from `source`, sharded on `mesh`.

    Without a mesh the model lives on the first device. `where` names the checkpoint in errors.
    """
    check_source(cfg, source, where)
    mesh = mesh if mesh is not None else make_mesh((1, 1, 1), jax.devices()[:1])
    abstract_model = nnx.eval_shape(
        lambda: Transformer(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype)
    )
    graphdef, state = nnx.split(abstract_model)
    shardings = param_shardings(state, mesh)
    layouts = leaf_layouts(cfg)
    np_dtype = np.dtype(param_dtype)
    for name, variable in state.items():
        abstract = variable.get_value()
        variable.set_value(
            _leaf_array(
                layouts[name], cfg, source, abstract, shardings[name].get_value(), np_dtype
            )
        )
    return nnx.merge(graphdef, state)
