"""`KVLayout`: both cache layouts hold the same keys and values and write them the same way."""

import jax
import numpy as np
import pytest

from spade_jax.models.attention import SlotMask, attention
from spade_jax.models.kv_layout import KVLayout

B, S, K, DH = 3, 24, 2, 4


def _heads(seed, length=S):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, length, K, DH)).astype(np.float32),
            rng.standard_normal((B, length, K, DH)).astype(np.float32))


def test_platform_choice():
    assert KVLayout.for_platform("cpu") is KVLayout.HEAD_MAJOR
    assert KVLayout.for_platform("tpu") is KVLayout.SEQUENCE_MAJOR
    assert KVLayout.for_platform("gpu") is KVLayout.SEQUENCE_MAJOR


@pytest.mark.parametrize("layout", list(KVLayout))
def test_layouts_hold_the_projected_heads(layout):
    k, v = _heads(0)
    stored = layout.from_heads(k, v)
    assert tuple(a.shape for a in stored) == layout.shapes(B, S, K, DH)
    assert layout.n_slots(stored[1]) == S
    k_t, v_hm = layout.head_major(*stored)
    np.testing.assert_array_equal(k_t, k.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(v_hm, v.transpose(0, 2, 1, 3))
    grown = layout.pad_slots(*stored, 8)
    assert layout.n_slots(grown[1]) == S + 8
    part = layout.slots(*stored, 5, 4)
    np.testing.assert_array_equal(layout.head_major(*part)[1], v_hm[:, :, 5:9])


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("where", ["shared", "per_row", "rows"])
def test_write_at_a_shared_or_per_row_slot_matches_a_loop(layout, where):
    """`write` puts each row's block at one slot for all rows, at each row's own slot, or
    (`rows`) block row i at cache row rows[i]'s own slot; slots past the window and rows past
    the batch are dropped (row 2's block runs over the window's end; `rows` names a row past
    the batch), as a loop over numpy arrays does."""
    k, v = _heads(1)
    block_k, block_v = _heads(2, length=3)
    starts = np.full(B, 20) if where == "shared" else np.array([0, 7, S - 1])
    rows = np.array([2, B, 0]) if where == "rows" else np.arange(B)
    slot = 20 if where == "shared" else jax.numpy.asarray(starts, jax.numpy.int32)
    cache = layout.from_heads(jax.numpy.asarray(k), jax.numpy.asarray(v))
    written = layout.write(cache, *layout.from_heads(block_k, block_v), slot,
                           jax.numpy.asarray(rows) if where == "rows" else None)
    expect_k, expect_v = k.copy(), v.copy()
    for i, r in enumerate(rows):
        for j, t in enumerate(range(starts[i], starts[i] + 3)):
            if r < B and t < S:
                expect_k[r, t], expect_v[r, t] = block_k[i, j], block_v[i, j]
    got = layout.head_major(*written)
    np.testing.assert_array_equal(got[0], expect_k.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(got[1], expect_v.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("n_queries", [1, 5])
def test_cached_attention_is_the_same_in_both_layouts(n_queries):
    """Decode (one query) and extend (several, online softmax over key blocks) attention
    over a cache with per-row valid slots give the same outputs in both layouts."""
    k, v = _heads(3)
    q = np.random.default_rng(4).standard_normal((B, n_queries, 2 * K, DH)).astype(np.float32)
    valid = np.arange(S)[None, :] < np.array([[S], [10], [17]])
    mask = SlotMask(jax.numpy.asarray(valid), 12)
    outs = [attention(q, *layout.from_heads(k, v), mask, causal=False, layout=layout,
                      key_block=8) for layout in KVLayout]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)
