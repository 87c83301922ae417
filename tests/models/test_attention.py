"""Attention: every path equals plain GQA maths, the kernels equal the XLA path, the choice."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models import attention as attn
from spade_jax.models.attention import AttentionKernel, DecodeAttention, SlotMask, attention


def _close(actual, expected, tol=2e-5):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        scale = float(jnp.max(jnp.abs(e)))
        assert scale > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=tol * scale, rtol=0)


def _plain_attention(q, k_t, v, mask):
    """GQA attention with the KV heads repeated and a dense [B, T, S] mask, autodiff only."""
    group = q.shape[2] // k_t.shape[1]
    k = jnp.repeat(k_t.swapaxes(-1, -2), group, axis=1)  # [B, H, S, Dh]
    v = jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("bthd,bhsd->bhts", q, k) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(mask[:, None], scores, attn.MASK_VALUE)
    return jnp.einsum("bhts,bhsd->bthd", jax.nn.softmax(scores, axis=-1), v)


def _qkv(seed, batch, q_len, n_heads, n_kv, head_dim, slots=None, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 3)
    slots = slots or q_len
    return (jax.random.normal(keys[0], (batch, q_len, n_heads, head_dim), dtype),
            jax.random.normal(keys[1], (batch, n_kv, head_dim, slots), dtype),
            jax.random.normal(keys[2], (batch, n_kv, slots, head_dim), dtype))


# ------------------------------------------------------------------------------ XLA paths
@pytest.mark.parametrize(("query_chunk", "causal"), [
    (512, False), (4, False),  # one block, and query-chunked blocks (the cached path)
    (512, True), (2, True),  # causal blocks of 3 queries, chunked inside
])
def test_xla_attention_equals_autodiff_of_plain_attention(query_chunk, causal, monkeypatch):
    """Left-padded rows, including padding query rows that see no key. The cached path
    (causal=False) serves the sampler and is checked forward only."""
    monkeypatch.setattr(attn, "CAUSAL_MIN_BLOCK", 3)
    q, k_t, v = _qkv(1, 2, 9, 6, 2, 8)
    real = jnp.ones((2, 9), bool).at[1, :3].set(False)  # row 1 left-padded by 3
    mask = SlotMask(real, 0)
    dense = mask.dense(9)
    assert not bool(dense[1, 0].any())  # a query row that sees nothing
    sees = dense.any(-1)[:, :, None, None]
    # A query that sees no key has no defined output; in training such rows get no gradient.
    cotangent = jnp.where(sees, jax.random.normal(jax.random.key(3), q.shape), 0.0)
    ours = jax.jit(lambda q, k_t, v: attention(q, k_t, v, mask, causal=causal,
                                               query_chunk=query_chunk, key_block=4))
    expected_out, expected_vjp = jax.vjp(lambda *a: _plain_attention(*a, dense), q, k_t, v)
    if not causal:
        out = ours(q, k_t, v)
        _close(jnp.where(sees, out, 0.0), jnp.where(sees, expected_out, 0.0))
        return
    out, vjp = jax.vjp(ours, q, k_t, v)
    _close(jnp.where(sees, out, 0.0), jnp.where(sees, expected_out, 0.0))
    _close(vjp(cotangent), expected_vjp(cotangent))


def test_query_chunked_attention_is_exact_in_value_and_gradient():
    q, k_t, v = _qkv(0, 2, 300, 6, 2, 16)
    mask = SlotMask(jnp.ones((2, 300), bool), 0)
    expected, expected_vjp = jax.vjp(lambda q: _plain_attention(q, k_t, v, mask.dense(300)), q)
    cotangent = jax.random.normal(jax.random.key(1), q.shape)

    def run(chunk, causal):
        return jax.jit(lambda q: attention(q, k_t, v, mask, query_chunk=chunk, causal=causal))

    # causal blocks (64 queries, the last 44) skipping the keys after each block; chunked inside
    for chunk in (4096, 16):
        out, vjp = jax.vjp(run(chunk, True), q)
        _close(out, expected)
        _close(vjp(cotangent), expected_vjp(cotangent))
    _close(run(128, False)(q), expected)  # the cached path, forward only
    with pytest.raises(ValueError, match="as many keys as queries from slot 0"):
        attention(q[:, :10], k_t, v, mask, causal=True)
    with pytest.raises(ValueError, match="from slot 5"):
        attention(q, k_t, v, SlotMask(mask.kv_valid, 5), causal=True)


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_attention_equals_a_numpy_reference(batch):
    """One query per row over transposed cached keys (a decode step) is exact GQA attention."""
    rng = np.random.default_rng(batch)
    n_kv, group, slots, head_dim = 2, 3, 40, 8
    q = rng.standard_normal((batch, 1, n_kv * group, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch, n_kv, slots, head_dim)).astype(np.float32)
    v = rng.standard_normal((batch, n_kv, slots, head_dim)).astype(np.float32)
    valid = rng.random((batch, slots)) > 0.3
    out = np.asarray(attention(jnp.asarray(q), jnp.asarray(k).swapaxes(-1, -2), jnp.asarray(v),
                               SlotMask(jnp.asarray(valid), slots - 1), causal=False))
    expected = np.zeros_like(q)
    for b in range(batch):
        for h in range(n_kv * group):
            kv = h // group
            scores = k[b, kv] @ q[b, 0, h] / np.sqrt(head_dim)
            scores = np.where(valid[b], scores, -np.inf)
            probs = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            expected[b, 0, h] = probs @ v[b, kv]
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("slots", "key_block", "query_chunk"), [
    (96, 32, 512),  # three key blocks, the last beyond the last query's slot (skipped)
    (100, 64, 512),  # keys padded to 128
    (96, 32, 8),  # query chunks too
])
def test_cached_extend_online_softmax_equals_the_direct_path(slots, key_block, query_chunk):
    """An extend of 20 queries from slot 40 over a cache with holes (left padding, a row
    with padding inside the block, an empty row) equals one softmax over the whole window."""
    q, k_t, v = _qkv(2, 3, 20, 4, 2, 16, slots=slots)
    valid = jnp.zeros((3, slots), bool).at[:, :60].set(True)
    valid = valid.at[0, :25].set(False).at[1, 50:60].set(False).at[2].set(False)
    mask = SlotMask(valid, 40)
    dense = mask.dense(20)
    run = jax.jit(lambda q, k_t, v, first: attention(
        q, k_t, v, SlotMask(valid, first), causal=False, key_block=key_block,
        query_chunk=query_chunk))
    out = run(q, k_t, v, 40)  # a traced first slot, as in the sampler
    sees = dense.any(-1)[:, :, None, None]
    expected = _plain_attention(q, k_t, v, dense)
    np.testing.assert_allclose(np.asarray(jnp.where(sees, out, 0.0)),
                               np.asarray(jnp.where(sees, expected, 0.0)), atol=1e-5, rtol=0)
    assert not bool(sees[2].any()) and not bool(jnp.any(out[2]))  # a row that sees nothing: 0


@pytest.mark.parametrize(("firsts", "query_chunk"), [
    ((20, 10, 0), 512),  # the furthest query is at slot 39: blocks 3-7 of 8 never read
    ((0, 0, 0), 512),  # a fresh prefill reads only its own blocks
    ((20, 10, 0), 8),  # query chunks: each reads up to its own furthest query
    ((100, 5, 0), 512),  # a long row: every block is read
])
def test_an_extend_reads_no_key_block_past_its_furthest_query(firsts, query_chunk):
    """An extend of 20 queries per row from each row's own slot (its cached tokens and then
    its block valid) in a 128-slot window of 16-key blocks: the blocks after the furthest
    query's slot are never read (NaN values there do not reach the output, as they would
    from any block read: masked scores still multiply their values), and the output is the
    direct softmax's."""
    slots, width, block = 128, 20, 16
    q, k_t, v = _qkv(5, 3, width, 4, 2, 16, slots=slots)
    first = jnp.asarray(firsts, jnp.int32)
    valid = jnp.arange(slots)[None, :] < (first + width)[:, None]
    run = jax.jit(lambda q, k_t, v: attention(
        q, k_t, v, SlotMask(valid, first), causal=False, key_block=block,
        query_chunk=query_chunk))
    unread = slice(-(-(max(firsts) + width) // block) * block, slots)
    out = run(q, k_t, v.at[:, :, unread].set(jnp.nan))
    assert not bool(jnp.isnan(out).any())
    if unread.start < slots:  # the NaN would show if those blocks were read
        assert bool(jnp.isnan(_plain_attention(q, k_t, v.at[:, :, unread].set(jnp.nan),
                                               SlotMask(valid, first).dense(width))).any())
    expected = _plain_attention(q, k_t, v, SlotMask(valid, first).dense(width))
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5, rtol=0)


def test_key_block_size_divides_sampler_windows_and_names_bad_input():
    assert [attn.key_block_size(n) for n in (64, 96, 768, 1536, 3072, 4096)] == [
        64, 96, 256, 512, 512, 512]
    assert attn.key_block_size(1000) == 512  # 1000 = 8 * 125: padded to 1024 instead
    with pytest.raises(ValueError, match="n_keys=0"):
        attn.key_block_size(0)


def test_cached_extend_has_no_whole_window_score_matrix():
    """XLA's memory analysis: the extend's temporaries no longer grow with the window."""
    batch, width, n_heads, n_kv, head_dim, slots = 2, 256, 8, 2, 64, 8192
    args = (jax.ShapeDtypeStruct((batch, width, n_heads, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((batch, n_kv, head_dim, slots), jnp.float32),
            jax.ShapeDtypeStruct((batch, n_kv, slots, head_dim), jnp.float32),
            jax.ShapeDtypeStruct((batch, slots), jnp.bool_))

    def temp_bytes(fn):
        return jax.jit(fn).lower(*args, 4096).compile().memory_analysis().temp_size_in_bytes

    def direct(q, k_t, v, valid, first):  # the previous path: one softmax over the window
        grouped = q.reshape(batch, width, n_kv, -1, head_dim).transpose(0, 2, 3, 1, 4)
        return attn._attention_block(grouped, k_t, v, SlotMask(valid, first).dense(width))

    def blocked(q, k_t, v, valid, first):
        return attention(q, k_t, v, SlotMask(valid, first), causal=False)

    scores = batch * n_heads * width * slots * 4  # one float32 score matrix over the window
    assert temp_bytes(direct) >= scores
    assert temp_bytes(blocked) < scores / 4


# ------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize(("length", "n_heads", "n_kv"), [(200, 4, 2), (128, 2, 1)])
def test_splash_kernel_equals_the_xla_path(length, n_heads, n_kv):
    """Pallas splash attention (interpreted on CPU): causal GQA over left-padded rows, padded
    to 256 (or exactly 128) slots; forward and gradients on the real tokens' rows."""
    q, k_t, v = _qkv(4, 2, length, n_heads, n_kv, 32)
    real = jnp.ones((2, length), bool).at[1, :37].set(False)
    mask = SlotMask(real, 0)
    sees = real[:, :, None, None]

    def loss(kernel):
        def f(q, k_t, v):
            out = attention(q, k_t, v, mask, causal=True, kernel=kernel)
            return jnp.sum(jnp.where(sees, out, 0.0) ** 2), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

    (_, splash_out), splash_grads = loss(AttentionKernel.SPLASH)(q, k_t, v)
    (_, xla_out), xla_grads = loss(AttentionKernel.XLA)(q, k_t, v)
    _close(jnp.where(sees, splash_out, 0.0), jnp.where(sees, xla_out, 0.0))
    _close(splash_grads, xla_grads, tol=5e-5)
    assert bool(jnp.all(jnp.isfinite(splash_out)))  # padding rows too


def test_splash_cached_shapes_run_the_xla_paths():
    """Extends and decode steps under model.attention=splash equal the XLA kernel's."""
    q, k_t, v = _qkv(5, 2, 12, 4, 2, 16, slots=64)
    mask = SlotMask(jnp.ones((2, 64), bool).at[0, :5].set(False), 30)
    for width in (12, 1):
        runs = [attention(q[:, :width], k_t, v, mask, causal=False, kernel=kernel)
                for kernel in (AttentionKernel.SPLASH, AttentionKernel.XLA)]
        np.testing.assert_array_equal(np.asarray(runs[0]), np.asarray(runs[1]))


def test_splash_block_sizes_fit_the_length_or_say_why_not():
    assert attn.splash_block_sizes(128).block_q == 128
    assert attn.splash_block_sizes(384).block_kv == 384
    sizes = attn.splash_block_sizes(1536)
    assert (sizes.block_q, sizes.block_kv_dkv, sizes.block_q_dq) == (512, 512, 512)
    assert attn.splash_block_sizes(640).block_q == 128  # 640 = 5 * 128
    with pytest.raises(ValueError, match=r"sequence length \(200\).*multiples of 128"):
        attn.splash_block_sizes(200)


def _cudnn_lowering(monkeypatch, fn, *args):
    """StableHLO of `fn` lowered for CUDA on this CPU machine: jax asks the cuDNN library for
    its version before lowering, which needs the CUDA plugin, so a version is supplied."""
    from jax._src.cudnn import fused_attention_stablehlo

    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 90100)
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("length", [64, 63])  # odd: padded to even for the bias kernel
def test_cudnn_kernel_lowers_to_cudnn_flash_attention_for_cuda(length, monkeypatch):
    s = jax.ShapeDtypeStruct
    args = (s((2, length, 4, 64), jnp.bfloat16), s((2, 2, 64, length), jnp.bfloat16),
            s((2, 2, length, 64), jnp.bfloat16), s((2, length), jnp.bool_))

    def loss(q, k_t, v, valid):
        out = attention(q, k_t, v, SlotMask(valid, 0), causal=True, kernel="cudnn")
        assert out.shape == q.shape
        return out.astype(jnp.float32).sum()

    hlo = _cudnn_lowering(monkeypatch, jax.grad(loss, argnums=(0, 1, 2)), *args)
    calls = set(re.findall(r"__cudnn\$fmha\w+", hlo))
    assert calls == {"__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward"}


def test_cudnn_arguments_mean_our_attention():
    """The arguments we hand cuDNN, run by jax's XLA implementation, give the XLA path's
    values (the cuDNN kernel itself needs a GPU)."""
    q, k_t, v = _qkv(6, 2, 40, 6, 2, 16)
    mask = SlotMask(jnp.ones((2, 40), bool).at[0, :7].set(False), 0)
    args, kwargs = attn.cudnn_arguments(q, k_t, v, mask)
    theirs = jax.nn.dot_product_attention(*args, **kwargs, implementation="xla")
    ours = attention(q, k_t, v, mask, causal=True)
    sees = mask.kv_valid[:, :, None, None]
    _close(jnp.where(sees, theirs, 0.0), jnp.where(sees, ours, 0.0))


def test_cudnn_refuses_float32():
    q, k_t, v = _qkv(7, 1, 8, 2, 1, 8)
    with pytest.raises(ValueError, match="'cudnn' needs bfloat16 or float16 compute, got float32"):
        attention(q, k_t, v, SlotMask(jnp.ones((1, 8), bool), 0), causal=True, kernel="cudnn")


# ------------------------------------------------------------------------------ the choice
@pytest.mark.parametrize(("kernel", "backend", "dtype", "expected"), [
    ("auto", "tpu", jnp.float32, "splash"),
    ("auto", "gpu", jnp.bfloat16, "cudnn"),
    ("auto", "cuda", jnp.float16, "cudnn"),
    ("auto", "gpu", jnp.float32, "xla"),  # cuDNN has no float32 flash kernel
    ("auto", "cpu", jnp.bfloat16, "xla"),
    ("xla", "tpu", jnp.bfloat16, "xla"),
    ("splash", "cpu", jnp.float32, "splash"),  # interpreted
    ("cudnn", "gpu", jnp.bfloat16, "cudnn"),
])
def test_kernel_choice(kernel, backend, dtype, expected):
    assert AttentionKernel(kernel).resolve(backend, dtype) is AttentionKernel(expected)


@pytest.mark.parametrize(("key", "kind", "chosen", "refused"), [
    ("attention", AttentionKernel, "splash", "flash"),
    ("decode_attention", DecodeAttention, "ragged", "paged"),
])
def test_model_config_takes_the_kernel_from_the_run_config(key, kind, chosen, refused):
    from spade_jax.config import load_config_file, parse
    from spade_jax.defaults import base_config
    from spade_jax.errors import ConfigError

    assert base_config().model[key] == "auto"
    cfg = load_config_file("tiny")
    cfg.model[key] = chosen
    run = parse(cfg)
    assert getattr(run.model, key) is kind(chosen)
    assert getattr(run.model.arch, key) is kind(chosen)
    cfg.model[key] = refused
    choices = ", ".join(repr(k.value) for k in kind)
    with pytest.raises(ConfigError, match=re.escape(f"model.{key}='{refused}': use one of "
                                                    f"({choices})")):
        parse(cfg)
    with pytest.raises(ValueError, match=f"{key}='{refused}'"):
        run.model.arch.replace(**{key: refused})


@pytest.mark.parametrize("n_kv", [2, 4])  # fewer KV heads than 'tensor' ranks, and as many
def test_splash_under_shard_map_with_heads_over_tensor_equals_the_xla_path(n_kv):
    """On a (1, 2, 4) mesh of fake CPUs the splash kernel runs per shard (rows over fsdp,
    heads over tensor, KV heads repeated when fewer than ranks); forward and gradients equal
    the XLA path's under the same mesh."""
    from spade_jax.sharding import make_mesh

    q, k_t, v = _qkv(6, 2, 128, 8, n_kv, 32)
    real = jnp.ones((2, 128), bool).at[0, :21].set(False)
    sees = real[:, :, None, None]

    def run(kernel):
        def f(q, k_t, v):
            out = attention(q, k_t, v, SlotMask(real, 0), causal=True, kernel=kernel)
            return jnp.sum(jnp.where(sees, out, 0.0) ** 2), out
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))

    with jax.set_mesh(make_mesh((1, 2, 4))):
        text = run(AttentionKernel.SPLASH).lower(q, k_t, v).as_text()
        (_, splash_out), splash_grads = run(AttentionKernel.SPLASH)(q, k_t, v)
        (_, xla_out), xla_grads = run(AttentionKernel.XLA)(q, k_t, v)
    assert "sdy.manual_computation" in text or "shard_map" in text
    _close(jnp.where(sees, splash_out, 0.0), jnp.where(sees, xla_out, 0.0))
    _close(splash_grads, xla_grads, tol=5e-5)
