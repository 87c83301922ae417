"""How a KV cache stores one layer's keys and values, chosen per backend.

XLA-CPU runs attention fastest as plain GEMMs with keys transposed (HEAD_MAJOR). The TPU
compiler wants each slot's [K, Dh] contiguous, slots major ([B, S, K, Dh]); handed the
head-major arrays, it copies every layer's whole cache into that layout and back around the
decode loop, which doubles the cache's footprint (SEQUENCE_MAJOR avoids it). Each member
carries the few operations that depend on the layout, so the attention and sampler code is
written once.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp


class KVLayout(enum.StrEnum):
    """One layer's (keys, values) arrays: HEAD_MAJOR keys transposed [B, K, Dh, S] and values
    [B, K, S, Dh]; SEQUENCE_MAJOR both [B, S, K, Dh]."""

    HEAD_MAJOR = "head_major"
    SEQUENCE_MAJOR = "sequence_major"

    @classmethod
    def for_platform(cls, platform: str) -> KVLayout:
        """The layout the compiler of `platform` ('cpu', 'tpu', 'gpu', ...) runs without
        copies: head-major GEMMs on CPU, slot-major elsewhere."""
        return cls.HEAD_MAJOR if platform == "cpu" else cls.SEQUENCE_MAJOR

    @property
    def slot_axes(self) -> tuple[int, int]:
        """(keys' slot axis, values' slot axis)."""
        return (3, 2) if self is KVLayout.HEAD_MAJOR else (1, 1)

    @property
    def head_axis(self) -> int:
        """The KV-head axis of both arrays."""
        return 1 if self is KVLayout.HEAD_MAJOR else 2

    def shapes(self, batch: int, slots: int, n_kv_heads: int,
               head_dim: int) -> tuple[tuple, tuple]:
        """(keys' shape, values' shape) of a cache layer."""
        if self is KVLayout.HEAD_MAJOR:
            return (batch, n_kv_heads, head_dim, slots), (batch, n_kv_heads, slots, head_dim)
        return ((batch, slots, n_kv_heads, head_dim),) * 2

    def n_slots(self, values: jax.Array) -> int:
        return values.shape[self.slot_axes[1]]

    def from_heads(self, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values [B, T, K, Dh] (as projected) in this layout."""
        if self is KVLayout.HEAD_MAJOR:
            return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
        return k, v

    def head_major(self, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(keys [B, K, Dh, S], values [B, K, S, Dh]): what the causal kernels take."""
        if self is KVLayout.HEAD_MAJOR:
            return k, v
        return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)

    def write(self, layer: tuple[jax.Array, jax.Array], k: jax.Array, v: jax.Array,
              slot: jax.Array | int,
              rows: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """`layer` with the block (k, v), in this layout, written from `slot` on: the same
        slots for every row, or with `slot` [B] from each row's own slot, one in-place scatter
        (a slot past the window drops that token). With `rows` [b] (and `slot` [b]) the
        block's b rows go to those rows of `layer` (a row past its batch is dropped)."""
        k, v = k.astype(layer[0].dtype), v.astype(layer[1].dtype)
        k_axis, v_axis = self.slot_axes
        if jnp.ndim(slot) == 1:
            targets = slot[:, None] + jnp.arange(k.shape[k_axis])
            if rows is not None:
                return (_set_slots_of_rows(layer[0], k_axis, k, rows, targets),
                        _set_slots_of_rows(layer[1], v_axis, v, rows, targets))
            return (_set_rows_slots(layer[0], k_axis, k, targets),
                    _set_rows_slots(layer[1], v_axis, v, targets))
        return (jax.lax.dynamic_update_slice_in_dim(layer[0], k, slot, k_axis),
                jax.lax.dynamic_update_slice_in_dim(layer[1], v, slot, v_axis))

    def slots(self, k: jax.Array, v: jax.Array, start: jax.Array | int, size: int,
              rows: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Slots [start, start + size) of both arrays (of only `rows` [b], where given; a row
        past the batch reads the last)."""
        k_axis, v_axis = self.slot_axes
        k, v = (jax.lax.dynamic_slice_in_dim(k, start, size, axis=k_axis),
                jax.lax.dynamic_slice_in_dim(v, start, size, axis=v_axis))
        if rows is None:
            return k, v
        return jnp.take(k, rows, axis=0, mode="clip"), jnp.take(v, rows, axis=0, mode="clip")

    def pad_slots(self, k: jax.Array, v: jax.Array, extra: int) -> tuple[jax.Array, jax.Array]:
        """Both arrays with `extra` empty slots appended."""
        pad = lambda a, axis: jnp.pad(  # noqa: E731
            a, [(0, extra if i == axis else 0) for i in range(a.ndim)])
        k_axis, v_axis = self.slot_axes
        return pad(k, k_axis), pad(v, v_axis)

    def scores(self, q_rows: jax.Array, k: jax.Array) -> jax.Array:
        """Float32 products [B, K, R, S] of query rows [B, K, R, Dh] with the keys."""
        if self is KVLayout.HEAD_MAJOR:
            return jnp.matmul(q_rows, k, preferred_element_type=jnp.float32)
        return jnp.einsum("bkrd,bskd->bkrs", q_rows, k, preferred_element_type=jnp.float32)

    def weighted_values(self, probs: jax.Array, v: jax.Array) -> jax.Array:
        """Float32 sums [B, K, R, Dh] of the values weighted by probs [B, K, R, S]."""
        if self is KVLayout.HEAD_MAJOR:
            return jnp.matmul(probs, v, preferred_element_type=jnp.float32)
        return jnp.einsum("bkrs,bskd->bkrd", probs, v, preferred_element_type=jnp.float32)


def _set_rows_slots(array: jax.Array, axis: int, block: jax.Array,
                    targets: jax.Array) -> jax.Array:
    """`array` with row r's `block` slots (along `axis`) at its slots `targets[r]` [W] (out of
    range: dropped)."""
    index = (slice(None),) * (axis - 1)  # per row (vmapped): the slot axis moves up one
    return jax.vmap(lambda c, s, t: c.at[(*index, t)].set(s, mode="drop"))(array, block, targets)


def _set_slots_of_rows(array: jax.Array, axis: int, block: jax.Array, rows: jax.Array,
                       targets: jax.Array) -> jax.Array:
    """`array` with `block` row i's slots (along `axis`) at row `rows[i]`'s slots
    `targets[i]` [W] (out of range: dropped)."""
    # the two index arrays' dimensions [b, W] lead the indexed result; the block's follow
    updates = jnp.moveaxis(block, axis, 1)
    index = (rows[:, None], *(slice(None),) * (axis - 1), targets)
    return array.at[index].set(updates, mode="drop")
