"""Grouped-query attention of the decoder, with a kernel per backend.

One entry point, `attention`, takes queries [B, T, H, Dh], keys and values in a `KVLayout`
(the training forward's is head-major: keys transposed k_t [B, K, Dh, S], values v
[B, K, S, Dh]) and a `SlotMask`, and never repeats the KV heads.
What runs depends on the call's shape and on `AttentionKernel`:
- causal self-attention (the training forward, S == T): Pallas splash attention on TPU (in a
  `shard_map`: rows over ('data', 'fsdp'), heads over 'tensor'),
  cuDNN flash attention through `jax.nn.dot_product_attention` on GPU (bfloat16/float16), and
  on CPU XLA einsums over causal query blocks with a flash-style hand-written backward;
- up to `DECODE_QUERIES` queries per row (a decode step and its drafts): the kernel
  `DecodeAttention` picks, on a TPU mesh the Pallas ragged decode (`ragged_decode.py`: each
  row's keys only up to its own last query), elsewhere one direct XLA product over the whole
  window;
- several queries against a KV cache (prefill, observation appends): an XLA online softmax
  over key blocks (`_flash_attention`), so no [B, H, chunk, S] float32 score matrix exists.
Splash and cuDNN cover the causal case only: splash's masks are static (a traced cache index
cannot be its causal offset) and cuDNN would need a [B, 1, T, S] bias, so the extends run the
XLA path on every backend.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp

from spade_jax.models.kv_layout import KVLayout
from spade_jax.sharding import MESH_AXES

MASK_VALUE = -2.3819763e38  # large negative that stays finite in float32 and bfloat16
ATTENTION_QUERY_CHUNK = 512  # queries per score block (XLA paths)
# At most this many queries per row (a decode step and its drafts) attend in one block over
# the whole cache, as a decode step does, rather than in key blocks
DECODE_QUERIES = 8
ATTENTION_KEY_BLOCK = 512  # keys per online-softmax step (cached XLA path)
RAGGED_MIN_BLOCK = 16  # the ragged decode's smallest key block (a grid step per fewer keys)
CAUSAL_BLOCKS = 8  # at most this many causal query blocks per layer (unrolled in its program)
CAUSAL_MIN_BLOCK = 64  # smaller blocks cost more in matmul efficiency than their skipped keys
SPLASH_LANES = 128  # splash block sizes must be multiples of the TPU's 128 lanes
SPLASH_MAX_BLOCK = 512
_HALF_DTYPES = (jnp.bfloat16, jnp.float16)


class AttentionKernel(enum.StrEnum):
    """`model.attention`: which kernel runs causal self-attention (AUTO: by backend)."""

    AUTO = "auto"
    XLA = "xla"
    SPLASH = "splash"
    CUDNN = "cudnn"

    def resolve(self, backend: str, dtype) -> AttentionKernel:
        """The concrete kernel for `backend` (jax.default_backend()) and compute `dtype`.

        AUTO picks splash on TPU, cuDNN on GPU when computing in bfloat16/float16 (cuDNN's
        flash attention has no float32 kernel), XLA otherwise. An explicit CUDNN with another
        dtype is refused rather than silently replaced.
        """
        half = jnp.dtype(dtype) in _HALF_DTYPES
        if self is AttentionKernel.AUTO:
            if backend == "tpu":
                return AttentionKernel.SPLASH
            if backend in ("gpu", "cuda") and half:
                return AttentionKernel.CUDNN
            return AttentionKernel.XLA
        if self is AttentionKernel.CUDNN and not half:
            raise ValueError(f"model.attention='cudnn' needs bfloat16 or float16 compute, got "
                             f"{jnp.dtype(dtype).name}; use model.attention='xla' or 'auto'")
        return self


class DecodeAttention(enum.StrEnum):
    """`model.decode_attention`: which kernel runs a decode step's attention over the cache
    (AUTO: RAGGED on a TPU mesh with the sequence-major cache, else XLA)."""

    AUTO = "auto"
    XLA = "xla"  # every row's queries against the whole window, one product
    # Pallas, each row's key blocks up to its last query (interpreted off TPU); a row's valid
    # slots must be [0, n), as the sampler's are
    RAGGED = "ragged"

    def resolve(self, platform: str, layout: KVLayout, n_keys: int) -> DecodeAttention:
        """The concrete kernel on `platform` (the mesh's) for a `layout` cache of `n_keys`
        slots. RAGGED needs the sequence-major cache and a window divisible by
        `RAGGED_MIN_BLOCK` slots (the sampler's windows, 2^i or 1.5 * 2^i, from 32 slots);
        AUTO falls back to XLA without them, an explicit RAGGED is refused."""
        fits = layout is KVLayout.SEQUENCE_MAJOR and n_keys % RAGGED_MIN_BLOCK == 0
        if self is DecodeAttention.AUTO:
            return DecodeAttention.RAGGED if platform == "tpu" and fits else DecodeAttention.XLA
        if self is DecodeAttention.RAGGED and not fits:
            raise ValueError(f"model.decode_attention='ragged' needs the sequence-major cache "
                             f"and a window divisible by {RAGGED_MIN_BLOCK} slots, got "
                             f"{layout.value} over {n_keys}; use 'xla' or 'auto'")
        return self


def context_platform() -> str:
    """The platform of the mesh a program is traced under (`jax.set_mesh`, the sampler's
    `traced_in_mesh`), else JAX's default backend: ahead-of-time TPU programs are traced on
    CPU hosts."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.default_backend() if mesh.empty else mesh.abstract_device.platform


class SlotMask(NamedTuple):
    """Which keys each query sees: query t sits at slot `first_query_slot + t` and sees the
    slots at or before its own that `kv_valid` [B, S] marks as real tokens.

    Every attention of the decoder has this form (the training forward at first slot 0, the
    sampler's extends and decode steps at each row's own slot, `first_query_slot` [B]), so a
    kernel can build the part of the mask it needs instead of reading a dense [B, T, S] one.
    """

    kv_valid: jax.Array
    first_query_slot: jax.Array | int

    def dense(self, n_queries: int, key_start: jax.Array | int = 0,
              n_keys: int | None = None) -> jax.Array:
        """[B, n_queries, n_keys] bool for the keys from slot `key_start` on (default: all)."""
        valid = self.kv_valid
        if n_keys is not None:
            valid = jax.lax.dynamic_slice_in_dim(valid, key_start, n_keys, axis=1)
        key_slot = key_start + jnp.arange(valid.shape[1])
        query_slot = jnp.asarray(self.first_query_slot)[..., None] + jnp.arange(n_queries)
        return (key_slot <= query_slot[..., None]) & valid[:, None, :]

    def narrowed(self, query_offset: jax.Array | int, n_keys: int) -> SlotMask:
        """The mask of the queries from `query_offset` on against the first `n_keys` slots."""
        return SlotMask(self.kv_valid[:, :n_keys], self.first_query_slot + query_offset)


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: SlotMask, *, causal: bool,
    kernel: AttentionKernel = AttentionKernel.XLA, layout: KVLayout = KVLayout.HEAD_MAJOR,
    query_chunk: int = ATTENTION_QUERY_CHUNK, key_block: int = ATTENTION_KEY_BLOCK,
    cache_rows: jax.Array | None = None, decode_kernel: DecodeAttention = DecodeAttention.XLA,
) -> jax.Array:
    """Grouped-query attention without repeating KV heads; returns [B, T, H, Dh].

    q: [B, T, H, Dh]; keys and values in `layout` (head-major: k [B, K, Dh, S] transposed, v
    [B, K, S, Dh]) with H a multiple of K. `causal=True` promises S == T and a first query
    slot of 0 (the no-cache training forward) and runs `kernel` (resolved for the current
    backend); otherwise up to `DECODE_QUERIES` queries per row are a decode step (with its
    drafts, run by `decode_kernel` resolved for the context mesh's platform) and more are a
    cached extend (XLA paths, see the module docstring; `query_chunk`
    queries and `key_block` keys per score block). An extend of some rows of a cache passes
    the whole cache and `cache_rows` [B], the cache row of each query row: it reads only
    their key blocks. A query that sees no key gets an unspecified finite output.
    """
    if cache_rows is not None and (causal or q.shape[1] <= DECODE_QUERIES):
        raise ValueError("cache_rows selects the rows of a cached extend's keys; a decode step "
                         "or causal attention reads all of its keys' rows")
    batch, q_len, n_heads, head_dim = q.shape
    if causal:
        k_t, v = layout.head_major(k, v)
        if q_len != k_t.shape[-1] or not (isinstance(mask.first_query_slot, int)
                                          and mask.first_query_slot == 0):
            raise ValueError(f"causal attention needs as many keys as queries from slot 0, got "
                             f"{k_t.shape[-1]} keys for {q_len} queries from slot "
                             f"{mask.first_query_slot}")
        kernel = AttentionKernel(kernel).resolve(jax.default_backend(), q.dtype)
        if kernel is AttentionKernel.SPLASH:
            return splash_sharded(q, k_t, v, mask.kv_valid)
        if kernel is AttentionKernel.CUDNN:
            return _cudnn_causal(q, k_t, v, mask)
    n_kv = k.shape[layout.head_axis]
    q = q.reshape(batch, q_len, n_kv, n_heads // n_kv, head_dim).transpose(0, 2, 3, 1, 4)
    if causal:
        out = _causal_blocks(q, k_t, v, mask, query_chunk)
    elif q_len <= DECODE_QUERIES:
        platform = context_platform()
        decode_kernel = DecodeAttention(decode_kernel).resolve(platform, layout,
                                                               layout.n_slots(v))
        if decode_kernel is DecodeAttention.RAGGED:
            from spade_jax.models.ragged_decode import ragged_decode_sharded

            key_end = jnp.sum(mask.kv_valid, axis=1, dtype=jnp.int32)  # no gaps (RAGGED)
            out = ragged_decode_sharded(q, k, v, key_end, mask.first_query_slot,
                                        interpret=platform != "tpu")
        else:
            out = _decode_block(q, k, v, mask.dense(q_len), layout)
    else:
        out = _chunked(lambda qc, m: _flash_attention(qc, k, v, m, key_block, layout,
                                                      cache_rows), q, mask, query_chunk)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, n_heads, head_dim)


# ------------------------------------------------------------------------------ XLA paths
def _gqa_scores(q: jax.Array, k: jax.Array, mask: jax.Array,
                layout: KVLayout = KVLayout.HEAD_MAJOR) -> jax.Array:
    """Scaled, masked float32 scores [B, K, G, C, S] of q [B, K, G, C, Dh] against the keys
    k in `layout` (head-major: k_t [B, K, Dh, S])."""
    batch, n_kv, group, length, head_dim = q.shape
    scores = layout.scores(q.reshape(batch, n_kv, group * length, head_dim), k)
    scores = scores.reshape(batch, n_kv, group, length, -1) * (head_dim**-0.5)
    return jnp.where(mask[:, None, None], scores, MASK_VALUE)


def _attention_block_forward(q, k, v, mask, layout: KVLayout = KVLayout.HEAD_MAJOR):
    batch, n_kv, group, length, head_dim = q.shape
    scores = _gqa_scores(q, k, mask, layout)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    exp = jnp.exp(scores - row_max)
    row_sum = jnp.sum(exp, axis=-1, keepdims=True)
    probs = (exp / row_sum).astype(v.dtype)
    out = layout.weighted_values(probs.reshape(batch, n_kv, group * length, -1), v)
    out = out.reshape(batch, n_kv, group, length, head_dim).astype(v.dtype)
    return out, (q, k, v, mask, out, row_max, row_sum)


@jax.custom_vjp
def _attention_block(q: jax.Array, k_t: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Exact GQA attention of one block of queries, as two batched matmuls over (B, K).

    q: [B, K, G, C, Dh]; k_t: [B, K, Dh, S]; v: [B, K, S, Dh]; mask: [B, C, S].
    Returns [B, K, G, C, Dh]. The G query heads of a KV head are stacked on the row axis
    ([G*C, Dh] @ [Dh, S]), the layout XLA-CPU runs as plain GEMMs (several times faster than
    the 5-axis einsum).
    The backward pass (`_attention_block_backward`) keeps only the softmax's row max and sum
    and recomputes the probabilities, as flash attention does, instead of autodiff's stored
    [B, H, C, S] scores and probabilities: for SmolLM2 at 8 x 256 tokens that is 38 MB less
    written and read per layer, and in a layer scan it also spares zero-filling the stacked
    buffers.
    """
    return _attention_block_forward(q, k_t, v, mask)[0]


def _attention_block_backward(residuals, d_out):
    q, k_t, v, mask, out, row_max, row_sum = residuals
    batch, n_kv, group, length, head_dim = q.shape
    rows = lambda a: a.reshape(batch, n_kv, group * length, -1)  # noqa: E731
    probs = jnp.exp(_gqa_scores(q, k_t, mask) - row_max) / row_sum
    d_out_rows = rows(d_out)
    d_v = jnp.matmul(rows(probs).astype(v.dtype).swapaxes(-1, -2), d_out_rows)
    d_probs = jnp.matmul(d_out_rows, v.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    # softmax backward: p * (dp - sum(p * dp)), with sum(p * dp) = sum(d_out * out) per row
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scores = probs * (d_probs.reshape(probs.shape) - delta)
    d_scores = jnp.where(mask[:, None, None], d_scores, 0.0) * (head_dim**-0.5)
    d_scores = rows(d_scores).astype(q.dtype)
    d_q = jnp.matmul(d_scores, k_t.swapaxes(-1, -2)).reshape(q.shape)
    d_k_t = jnp.matmul(rows(q).swapaxes(-1, -2), d_scores)
    return d_q, d_k_t, d_v, None


_attention_block.defvjp(_attention_block_forward, _attention_block_backward)


def _decode_block(q, k, v, mask: jax.Array, layout: KVLayout) -> jax.Array:
    """A decode step's queries per row, q [B, K, G, C, Dh], over the whole cache in `layout`: the
    forward of `_attention_block` without its custom VJP (the sampler never differentiates)."""
    return _attention_block_forward(q, k, v, mask, layout)[0]


def _causal_blocks(q, k_t, v, mask: SlotMask, query_chunk):
    """Causal attention of q [B, K, G, T, Dh] in up to `CAUSAL_BLOCKS` query blocks, each
    against only the keys up to its last query (skipping the masked upper triangle); long
    blocks go `query_chunk` queries at a time, each rematerialised in the backward pass, so
    the float32 scores held at once are [B, H, chunk, S] instead of [B, H, T, S]."""
    q_len = q.shape[3]
    block = max(CAUSAL_MIN_BLOCK, -(-q_len // CAUSAL_BLOCKS))
    outs = []
    for start in range(0, q_len, block):
        end = min(start + block, q_len)  # the block's last query sees keys [0, end)
        k_block, v_block = k_t[..., :end], v[:, :, :end]
        outs.append(_chunked(
            lambda qc, m, k=k_block, w=v_block: _attention_block(qc, k, w, m.dense(qc.shape[3])),
            q[:, :, :, start:end], mask.narrowed(start, end), query_chunk, remat=True))
    return jnp.concatenate(outs, axis=3)


def _chunked(block_fn, q, mask: SlotMask, query_chunk, *, remat: bool = False):
    """`block_fn(q_chunk, mask_of_chunk)` over q [B, K, G, T, Dh], `query_chunk` queries at a
    time (one `lax.map`; `remat`: each chunk recomputed in the backward pass), concatenated
    back to [B, K, G, T, Dh]."""
    q_len, head_dim = q.shape[3], q.shape[4]
    if q_len <= query_chunk:
        return block_fn(q, mask)
    if remat:
        block_fn = jax.checkpoint(block_fn)
    n_chunks = -(-q_len // query_chunk)
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, n_chunks * query_chunk - q_len), (0, 0)))
    q_chunks = jnp.moveaxis(q.reshape(*q.shape[:3], n_chunks, query_chunk, head_dim), 3, 0)
    starts = jnp.arange(n_chunks) * query_chunk
    out = jax.lax.map(lambda qs: block_fn(qs[0], mask.narrowed(qs[1], mask.kv_valid.shape[1])),
                      (q_chunks, starts))  # [n_chunks, B, K, G, C, Dh]
    out = jnp.moveaxis(out, 0, 3).reshape(*q.shape[:3], n_chunks * query_chunk, head_dim)
    return out[:, :, :, :q_len]


def key_block_size(n_keys: int, preferred: int = ATTENTION_KEY_BLOCK) -> int:
    """Keys per online-softmax step: the largest power of two <= `preferred` dividing
    `n_keys` (the sampler's windows, 2^i or 1.5 * 2^i, need no padding), or `preferred` when
    that would be under a quarter of it (the keys are then padded)."""
    if n_keys < 1 or preferred < 1:
        raise ValueError(f"key block for n_keys={n_keys}, preferred={preferred}: both must be "
                         ">= 1")
    if n_keys <= preferred:
        return n_keys
    block = 1 << (preferred.bit_length() - 1)
    while n_keys % block:
        block //= 2
    return block if 4 * block >= preferred else preferred


def _flash_attention(q, k, v, mask: SlotMask, key_block: int, layout: KVLayout,
                     cache_rows: jax.Array | None = None):
    """Attention of q [B, K, G, C, Dh] over the cache (in `layout`; its rows `cache_rows`,
    where given) with an online softmax over key blocks.

    A loop over blocks of `key_block_size` keys keeps a running row max, row sum and
    unnormalised output in float32, so the largest score tensor is [B, H, C, block] however
    long the window; the blocks after the furthest query's slot are never visible and never
    read, so an extend's cost follows its rows' lengths, not the window's. Forward only: it
    serves the sampler. A query that sees no key gets zeros.
    """
    batch, n_kv, group, length, head_dim = q.shape
    n_keys = layout.n_slots(v)
    block = key_block_size(n_keys, key_block)
    n_blocks = -(-n_keys // block)
    pad = n_blocks * block - n_keys
    kv_valid = mask.kv_valid
    if pad:
        k, v = layout.pad_slots(k, v, pad)
        kv_valid = jnp.pad(kv_valid, ((0, 0), (0, pad)))
    rows = q.reshape(batch, n_kv, group * length, head_dim)
    last_slot = mask.first_query_slot + length - 1
    if isinstance(last_slot, int):  # static: a differentiable scan
        n_live = min(n_blocks, last_slot // block + 1)
    else:
        n_live = jnp.minimum(n_blocks, jnp.max(last_slot) // block + 1)
    mask = SlotMask(kv_valid, mask.first_query_slot)

    def step(i, carry):
        row_max, row_sum, acc = carry
        k_block, v_block = layout.slots(k, v, i * block, block, cache_rows)
        visible = mask.dense(length, i * block, block)[:, None, None]  # [B, 1, 1, C, block]
        scores = layout.scores(rows, k_block)
        scores = scores.reshape(batch, n_kv, group, length, block) * (head_dim**-0.5)
        scores = jnp.where(visible, scores, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(scores, axis=-1))
        probs = jnp.where(visible, jnp.exp(scores - new_max[..., None]), 0.0)
        rescale = jnp.exp(row_max - new_max)
        row_sum = row_sum * rescale + jnp.sum(probs, axis=-1)
        pv = layout.weighted_values(
            probs.reshape(batch, n_kv, group * length, block).astype(v.dtype), v_block)
        acc = acc * rescale[..., None] + pv.reshape(acc.shape)
        return new_max, row_sum, acc

    stats = jnp.full((batch, n_kv, group, length), MASK_VALUE, jnp.float32)
    init = (stats, jnp.zeros_like(stats), jnp.zeros(q.shape, jnp.float32))
    _, row_sum, acc = jax.lax.fori_loop(0, n_live, step, init)
    return (acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]).astype(q.dtype)


# ------------------------------------------------------------------------------ kernels
def splash_block_sizes(length: int, max_block: int = SPLASH_MAX_BLOCK):
    """Splash `BlockSizes` for a (padded) sequence of `length`: the largest multiple of 128
    lanes up to `max_block` that divides it, for the forward and both backward kernels."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    if length % SPLASH_LANES or max_block % SPLASH_LANES or max_block < SPLASH_LANES:
        raise ValueError(f"splash attention needs a sequence length ({length}) and largest "
                         f"block ({max_block}) that are multiples of {SPLASH_LANES}; pad the "
                         "sequence first")
    block = max(b for b in range(SPLASH_LANES, min(max_block, length) + 1, SPLASH_LANES)
                if length % b == 0)
    return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                             block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                             block_q_dq=block, block_kv_dq=block)


def _splash_causal(q, k_t, v, kv_valid):
    """Causal GQA with Pallas splash attention (interpreted off TPU), padding as segments.

    Real tokens are segment 1 and padding segment 0, so a padding query sees earlier padding
    (never an empty row) and a real query only real keys. The sequence is padded at its end
    to a multiple of 128 (the causal mask keeps every real query from those slots).
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, q_len, n_heads, head_dim = q.shape
    padded = -(-q_len // SPLASH_LANES) * SPLASH_LANES
    extra = padded - q_len
    q = jnp.pad(q.transpose(0, 2, 1, 3) * jnp.asarray(head_dim**-0.5, q.dtype),
                ((0, 0), (0, 0), (0, extra), (0, 0)))  # [B, H, T', Dh], scaled
    k = jnp.pad(k_t.swapaxes(-1, -2), ((0, 0), (0, 0), (0, extra), (0, 0)))  # [B, K, T', Dh]
    v = jnp.pad(v, ((0, 0), (0, 0), (0, extra), (0, 0)))
    segments = jnp.pad(kv_valid.astype(jnp.int32), ((0, 0), (0, extra)))
    causal = splash.MultiHeadMask([splash.CausalMask((padded, padded))] * n_heads)
    kernel = splash.make_splash_mha(
        causal, block_sizes=splash_block_sizes(padded), head_shards=1, q_seq_shards=1,
        interpret=jax.default_backend() != "tpu")
    out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, splash.SegmentIds(q=s, kv=s)))(
        q, k, v, segments)
    return out[:, :, :q_len].transpose(0, 2, 1, 3)


def splash_sharded(q, k_t, v, kv_valid):
    """`_splash_causal` in a `shard_map` over the context mesh (`jax.set_mesh`): rows over
    ('data', 'fsdp'), query heads over 'tensor' (a Pallas call is opaque to the SPMD
    partitioner, which would otherwise gather every head onto every device).

    With fewer KV heads than 'tensor' ranks (Qwen3-30B-A3B: 4 over 8) each KV head is repeated
    so that every rank holds the one its query heads read. Without a mesh, or when the heads
    do not split over 'tensor', heads stay whole on each device.
    """
    from jax.sharding import PartitionSpec

    mesh = jax.sharding.get_abstract_mesh()
    if not set(MESH_AXES) <= set(mesh.axis_names):
        return _splash_causal(q, k_t, v, kv_valid)
    batch, _, n_heads, _ = q.shape
    n_kv, tp = k_t.shape[1], mesh.shape["tensor"]
    rows = MESH_AXES[:2] if batch % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0 else None
    heads = "tensor" if n_heads % tp == 0 and (n_kv % tp == 0 or tp % n_kv == 0) else None
    if heads and n_kv < tp:
        k_t, v = jnp.repeat(k_t, tp // n_kv, axis=1), jnp.repeat(v, tp // n_kv, axis=1)
    spec = PartitionSpec
    # check_vma=False: the splash kernel's outputs carry no varying-axes type; nothing inside
    # communicates, so there is no collective whose transpose that could get wrong.
    return jax.shard_map(
        _splash_causal, mesh=mesh, check_vma=False,
        in_specs=(spec(rows, None, heads), spec(rows, heads), spec(rows, heads), spec(rows)),
        out_specs=spec(rows, None, heads))(q, k_t, v, kv_valid)


def cudnn_arguments(q, k_t, v, mask: SlotMask) -> tuple[tuple, dict]:
    """(args, kwargs) of `jax.nn.dot_product_attention` for causal attention in our layout:
    keys and values as [B, S, K, Dh], the padding as a [B, 1, T, S] mask (which jax turns
    into a bias; any padding pattern), and `is_causal` so cuDNN skips the upper triangle."""
    key = k_t.transpose(0, 3, 1, 2)
    value = v.transpose(0, 2, 1, 3)
    return (q, key, value), {"mask": mask.dense(q.shape[1])[:, None], "is_causal": True}


def _cudnn_causal(q, k_t, v, mask: SlotMask):
    """Causal GQA with cuDNN flash attention (GPU, bfloat16/float16)."""
    if q.shape[1] % 2:  # cuDNN's training kernel with a bias wants even lengths
        pad = ((0, 0), (0, 1))
        q = jnp.pad(q, (*pad, (0, 0), (0, 0)))
        k_t = jnp.pad(k_t, ((0, 0), (0, 0), *pad))
        v = jnp.pad(v, ((0, 0), *pad, (0, 0)))
        out = _cudnn_causal(q, k_t, v, SlotMask(jnp.pad(mask.kv_valid, pad), 0))
        return out[:, :-1]
    args, kwargs = cudnn_arguments(q, k_t, v, mask)
    return jax.nn.dot_product_attention(*args, **kwargs, implementation="cudnn")

