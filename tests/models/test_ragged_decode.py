"""The Pallas ragged decode (interpreted on CPU) against the XLA decode, and its choice."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models.attention import DecodeAttention, SlotMask, _decode_block, attention
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.ragged_decode import (
    last_live_slot,
    live_key_block,
    ragged_block_size,
    ragged_decode,
)
from spade_jax.sharding import make_mesh

SEQUENCE_MAJOR = KVLayout.SEQUENCE_MAJOR


def _rows(seed, n_queries, batch=5, slots=128, n_kv=2, group=3, head_dim=16):
    """q [B, K, G, C, Dh], sequence-major k and v, each row's key end, its first query's slot
    and its valid slots, for rows of very different lengths: one starting at slot 0, one
    whose drafts run past the window's end, one finished (its queries at the window's end, as
    the sampler places a finished row's), the others anywhere."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, n_kv, group, n_queries, head_dim)).astype(np.float32)
    k, v = rng.standard_normal((2, batch, slots, n_kv, head_dim)).astype(np.float32)
    first = rng.integers(0, slots - n_queries, batch)
    first[:2] = 0, slots - 2
    key_end = first + n_queries
    first[2] = slots
    valid = np.arange(slots)[None] < key_end[:, None]
    return (*map(jnp.asarray, (q, k, v, key_end, first, valid)),)


def _xla(q, k, v, valid, first):
    return _decode_block(q, k, v, SlotMask(valid, first).dense(q.shape[3]), SEQUENCE_MAJOR)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_queries", [1, 5])  # a decode step; one with 4 drafts
@pytest.mark.parametrize("key_block", [16, 32, 128])
def test_ragged_decode_equals_the_xla_decode(seed, n_queries, key_block):
    q, k, v, key_end, first, valid = _rows(seed, n_queries)
    out = ragged_decode(q, k, v, key_end, first, interpret=True, key_block=key_block)
    np.testing.assert_allclose(out, _xla(q, k, v, valid, first), atol=2e-5, rtol=0)


@pytest.mark.parametrize("n_queries", [1, 5])
def test_ragged_decode_ignores_the_key_blocks_past_a_rows_last_query(n_queries):
    """Keys and values after each row's last live block are NaN: the XLA decode, which
    multiplies the whole window, returns NaN; the ragged decode does not fold them in."""
    q, k, v, key_end, first, valid = _rows(3, n_queries)
    block = 16
    live_end = ((jnp.minimum(first + n_queries, key_end) - 1) // block + 1) * block
    dead = (jnp.arange(k.shape[1])[None] >= live_end[:, None])[:, :, None, None]
    assert bool(dead.any())
    k_dead, v_dead = jnp.where(dead, jnp.nan, k), jnp.where(dead, jnp.nan, v)
    assert not bool(jnp.isfinite(_xla(q, k_dead, v_dead, valid, first)).all())
    out = ragged_decode(q, k_dead, v_dead, key_end, first, interpret=True, key_block=block)
    np.testing.assert_allclose(out, _xla(q, k, v, valid, first), atol=2e-5, rtol=0)


@pytest.mark.parametrize("n_queries", [1, 5])
def test_each_row_copies_in_only_its_live_key_blocks(n_queries):
    """The block each grid step of a row copies in: its blocks 0 .. the one holding its last
    query or its last key, whichever comes first, then that one repeated (no new copy)."""
    block, steps = 16, 8
    for first, key_end in ((0, n_queries), (11, 11 + n_queries), (12, 12 + n_queries),
                           (40, 40 + n_queries), (126, 128), (128, 37), (128, 0)):
        last = max(min(first + n_queries, key_end) - 1, 0) // block
        last_slot = last_live_slot(jnp.int32(first), jnp.int32(key_end), n_queries)
        fetched = [int(live_key_block(i, last_slot, block)) for i in range(steps)]
        expected = list(range(min(last, steps - 1) + 1))
        assert fetched == expected + [expected[-1]] * (steps - len(expected)), (first, fetched)


@pytest.mark.parametrize("n_kv", [2, 4])  # KV heads over 'tensor' (2 ranks), or rows over it
def test_attention_runs_the_ragged_decode_per_shard_of_the_cache(n_kv):
    """Under a (1, 2, 2) mesh of fake CPUs, `attention` with decode_kernel=RAGGED runs the
    kernel in a shard_map split as the sampler splits the cache, and equals the XLA decode."""
    q, k, v, _, first, valid = _rows(4, 5, batch=4, n_kv=n_kv, group=2)
    queries = q.transpose(0, 3, 1, 2, 4).reshape(4, 5, n_kv * 2, 16)  # [B, C, H, Dh]

    def run(kernel):
        return jax.jit(lambda *a: attention(*a, causal=False, layout=SEQUENCE_MAJOR,
                                            decode_kernel=kernel))

    mask = SlotMask(valid, first)
    with jax.set_mesh(make_mesh((1, 2, 2), jax.devices()[:4])):
        text = run(DecodeAttention.RAGGED).lower(queries, k, v, mask).as_text()
        ragged = run(DecodeAttention.RAGGED)(queries, k, v, mask)
        xla = run(DecodeAttention.XLA)(queries, k, v, mask)
    assert "sdy.manual_computation" in text or "shard_map" in text
    np.testing.assert_allclose(ragged, xla, atol=2e-5, rtol=0)


@pytest.mark.parametrize(("kernel", "platform", "layout", "slots", "expected"), [
    ("auto", "tpu", "sequence_major", 8192, "ragged"),
    ("auto", "tpu", "sequence_major", 24, "xla"),  # a window without 16-slot blocks
    ("auto", "tpu", "head_major", 8192, "xla"),
    ("auto", "cpu", "sequence_major", 8192, "xla"),
    ("auto", "gpu", "sequence_major", 8192, "xla"),
    ("xla", "tpu", "sequence_major", 8192, "xla"),
    ("ragged", "cpu", "sequence_major", 96, "ragged"),  # interpreted
])
def test_decode_kernel_choice(kernel, platform, layout, slots, expected):
    chosen = DecodeAttention(kernel).resolve(platform, KVLayout(layout), slots)
    assert chosen is DecodeAttention(expected)


def test_ragged_decode_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="sequence-major cache.*head_major over 96"):
        DecodeAttention.RAGGED.resolve("tpu", KVLayout.HEAD_MAJOR, 96)
    with pytest.raises(ValueError, match="divisible by 16 slots, got 24"):
        ragged_block_size(24)
    assert [ragged_block_size(n) for n in (32, 96, 1536, 8192)] == [32, 32, 128, 128]

