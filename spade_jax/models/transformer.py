"""One Flax NNX decoder for Llama (SmolLM2), Qwen3 dense and Qwen3-MoE.

Layer parameters are stacked on a leading `layers` axis and the forward pass is a `lax.scan`
over them (fast compiles at 48+ layers, one checkpoint layout). Every parameter carries its
logical PartitionSpec over the mesh axes ('data', 'fsdp', 'tensor') as NNX metadata; see
`spade_jax.sharding` for how specs are fitted to a concrete mesh.

Mixture of experts: experts are stacked [E, D, F] and split over 'tensor' by expert or by hidden
column (`moe.MoeSharding`, config key `model.moe_sharding`); `moe.moe_mlp` routes each token to
its top-k experts, tensor-parallel over 'tensor' when traced under the mesh (`jax.set_mesh`, as
the train step and sampler do).
"""

from __future__ import annotations

import contextlib

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from spade_jax.models import layers, moe
from spade_jax.models.attention import SlotMask, attention
from spade_jax.models.config import ModelConfig
from spade_jax.models.kv_layout import KVLayout
from spade_jax.sharding import BATCH_AXES, constrain

# The residual stream [B, T, D] between layers: rows over the batch axes, D whole. Pinned so
# that XLA gathers each layer's fsdp-split weights (FSDP) rather than contracting over the
# split D and all-reducing activations of the whole batch.
ROWS_SPLIT = (BATCH_AXES, None, None)


def _param(rngs: nnx.Rngs, shape, spec, dtype, scale=0.02) -> nnx.Param:
    value = scale * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, sharding_names=spec, eager_sharding=False)


def _ones(shape, spec, dtype) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, dtype), sharding_names=spec, eager_sharding=False)


class Transformer(nnx.Module):
    """Decoder-only transformer; `__call__` returns final-norm hidden states [B, T, D]."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        cfg.validate()
        self.cfg = cfg
        L, D, H, K, Dh = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        p = lambda shape, spec: _param(rngs, shape, spec, param_dtype)  # noqa: E731
        self.embed = p((cfg.vocab_size, D), ("tensor", "fsdp"))
        self.attn_norm = _ones((L, D), (None, None), param_dtype)
        self.wq = p((L, D, H, Dh), (None, "fsdp", "tensor", None))
        self.wk = p((L, D, K, Dh), (None, "fsdp", "tensor", None))
        self.wv = p((L, D, K, Dh), (None, "fsdp", "tensor", None))
        self.wo = p((L, H, Dh, D), (None, "tensor", None, "fsdp"))
        if cfg.qk_norm:
            self.q_norm = _ones((L, Dh), (None, None), param_dtype)
            self.k_norm = _ones((L, Dh), (None, None), param_dtype)
        self.mlp_norm = _ones((L, D), (None, None), param_dtype)
        if cfg.is_moe:
            E, F = cfg.n_experts, cfg.expert_ffn_dim
            self.router = p((L, D, E), (None, "fsdp", None))
            gate_axes, down_axes = cfg.moe_sharding.weight_axes()
            self.w_gate = p((L, E, D, F), gate_axes)
            self.w_up = p((L, E, D, F), gate_axes)
            self.w_down = p((L, E, F, D), down_axes)
        else:
            F = cfg.ffn_dim
            self.w_gate = p((L, D, F), (None, "fsdp", "tensor"))
            self.w_up = p((L, D, F), (None, "fsdp", "tensor"))
            self.w_down = p((L, F, D), (None, "tensor", "fsdp"))
        self.final_norm = _ones((D,), (None,), param_dtype)
        if not cfg.tie_embeddings:
            self.lm_head = p((D, cfg.vocab_size), ("fsdp", "tensor"))

    def _layer_params(self) -> dict[str, jax.Array]:
        names = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]
        if self.cfg.qk_norm:
            names += ["q_norm", "k_norm"]
        if self.cfg.is_moe:
            names += ["router"]
        return {name: getattr(self, name)[...] for name in names}

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        *,
        kv_mask: jax.Array,
        compute_dtype=None,
        remat: bool = False,
        record_router_load: bool = False,
    ) -> jax.Array:
        """Run the decoder on `tokens` [B, T] at rotary `positions` [B, T] (the training path).

        Attention is causal over the T tokens and `kv_mask` [B, T] marks real (non-padding)
        tokens. Matmuls run in `compute_dtype` (None: the weights' dtype), each layer's weights
        cast on the fly, so float32 master weights train with bf16 compute; norms, rotary,
        softmax (layers.py) and the caller's logits stay float32. `remat=True` recomputes each
        layer's activations in the backward pass (jax.checkpoint on the scanned block): less
        memory for training, about a third more compute. Returns hidden states [B, T, D] after
        the final norm. Cached decoding is `unrolled_forward` (the sampler's path).
        `record_router_load=True` (MoE) sows the layers' `moe.RouterLoad`, stacked over layers
        ([L, E] copies per expert, [L] dropped), as the `nnx.Intermediate` 'router_load'.
        """
        cfg = self.cfg
        # `is None`, not `or`: a numpy dtype is falsy (it has no fields)
        dtype = self.embed.dtype if compute_dtype is None else jnp.dtype(compute_dtype)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0).astype(dtype), ROWS_SPLIT)
        mask = SlotMask(kv_mask, 0)

        def block(x, params):
            params = jax.tree.map(lambda a: a.astype(dtype), params)
            x, _, load = decoder_block(cfg, params, x, positions, mask, None, 0)
            return constrain(x, ROWS_SPLIT), load

        if remat:
            block = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
        x, router_load = jax.lax.scan(block, x, self._layer_params())
        if record_router_load and router_load is not None:
            self.sow(nnx.Intermediate, "router_load", router_load)
        return layers.rms_norm(x, self.final_norm[...], cfg.rms_eps)

    def layer_params(self, *, fuse: bool = False, out_major: bool = False
                     ) -> list[dict[str, jax.Array | layers.Projection]]:
        """Per-layer weights for `unrolled_forward` (the sampler's layout).

        `fuse=True` concatenates q/k/v and gate/up into one matrix each, so a decode step runs
        three large matmuls per layer instead of six (faster on CPU), and holds the attention's
        and the dense MLP's matrices (`wqkv`, `wo`, `w_gate_up`, `w_down`; not a router's or the
        experts') as `layers.Projection`s, [out, in] where `out_major`. This copies the
        weights once (outside any decode loop); use it where the extra memory is affordable.
        """
        stacked = self._layer_params()
        per_layer = [{name: value[i] for name, value in stacked.items()}
                     for i in range(self.cfg.n_layers)]
        if not fuse:
            return per_layer

        def project(matrix: jax.Array) -> layers.Projection:
            return layers.Projection(matrix.T if out_major else matrix, out_major)

        for p in per_layer:
            d_model = p["wq"].shape[0]
            p["wqkv"] = project(jnp.concatenate(
                [p.pop(n).reshape(d_model, -1) for n in ("wq", "wk", "wv")], axis=1))
            p["wo"] = project(p["wo"].reshape(-1, d_model))
            if not self.cfg.is_moe:
                p["w_gate_up"] = project(
                    jnp.concatenate([p.pop("w_gate"), p.pop("w_up")], axis=1))
                p["w_down"] = project(p["w_down"])
        return per_layer

    def output_projection(self) -> tuple[jax.Array, bool]:
        """(weight, vocab_major): the tied [vocab, D] embedding or the [D, vocab] lm_head.

        Callers contract against the layout as stored (`layers.vocab_logits`) rather than a
        transposed copy, which would be materialised in the training log-probs' backward pass.
        """
        if self.cfg.tie_embeddings:
            return self.embed[...], True
        return self.lm_head[...], False

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., vocab] of hidden states [..., D]."""
        return layers.vocab_logits(hidden, *self.output_projection())


def decoder_block(
    cfg: ModelConfig,
    params: dict[str, jax.Array],
    x: jax.Array,
    positions: jax.Array,
    mask: SlotMask,
    layer_cache: tuple[jax.Array, jax.Array] | None,
    cache_index: jax.Array | int,
    layout: KVLayout = KVLayout.HEAD_MAJOR,
    cache_rows: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array], moe.RouterLoad | None]:
    """One decoder layer on x [B, T, D]; returns (x, (keys, values), the MoE's `RouterLoad`
    or None).

    With `layer_cache` = (keys, values) over `slots` in `layout` (see `KVLayout`), the new
    keys/values are written at `cache_index` (per row: [B]) and attention runs over all the
    slots of that cache (callers size it to the live window); the returned pair is the
    updated cache. An extend of only some rows of the cache names them, `cache_rows` [B]
    (one per row of x), and writes and reads only those rows.
    Without a cache it is this block's keys/values in `layout`, and `mask` must start
    at slot 0 (causal self-attention, run by the kernel `cfg.attention` picks; see
    `attention.attention`). Projections are plain
    2-D matmuls (the [D, H, Dh] weights reshaped, a free bitcast): XLA-CPU runs multi-axis
    einsums several times slower.
    `params` may hold the fused `wqkv` / `w_gate_up` projections (see
    `Transformer.layer_params(fuse=True)`).
    """
    batch, length, d_model = x.shape
    n_q, n_kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    heads = lambda a, n: a.reshape(batch, length, n, cfg.head_dim)  # noqa: E731
    h = layers.rms_norm(x, params["attn_norm"], cfg.rms_eps)
    fused = "wqkv" in params
    if fused:
        qkv = params["wqkv"](h)
        q, k, v = qkv[..., :n_q], qkv[..., n_q:n_q + n_kv], qkv[..., n_q + n_kv:]
    else:
        q, k, v = (h @ params[n].reshape(d_model, -1) for n in ("wq", "wk", "wv"))
    q, k, v = heads(q, cfg.n_heads), heads(k, cfg.n_kv_heads), heads(v, cfg.n_kv_heads)
    if cfg.qk_norm:
        q = layers.rms_norm(q, params["q_norm"], cfg.rms_eps)
        k = layers.rms_norm(k, params["k_norm"], cfg.rms_eps)
    q = layers.apply_rope(q, positions, cfg.rope_theta)
    k = layers.apply_rope(k, positions, cfg.rope_theta)
    k, v = layout.from_heads(k, v)
    if layer_cache is not None:
        k, v = layout.write(layer_cache, k, v, cache_index, cache_rows)
    attn = attention(q, k.astype(x.dtype), v.astype(x.dtype), mask,
                     causal=layer_cache is None, kernel=cfg.attention, layout=layout,
                     cache_rows=cache_rows, decode_kernel=cfg.decode_attention)
    attn = attn.reshape(batch, length, n_q)
    x = x + (params["wo"](attn) if fused else attn @ params["wo"].reshape(n_q, d_model))
    h = layers.rms_norm(x, params["mlp_norm"], cfg.rms_eps)
    load = None
    if cfg.is_moe:
        out, load = moe.moe_mlp(
            h, params["router"], params["w_gate"], params["w_up"], params["w_down"],
            cfg.n_experts_per_tok, cfg.norm_topk_prob, cfg.moe_capacity_factor,
            cfg.moe_sharding,
        )
        x = x + out
    elif fused:
        gate, up = jnp.split(params["w_gate_up"](h), 2, axis=-1)
        x = x + params["w_down"](jax.nn.silu(gate) * up)
    else:
        x = x + layers.swiglu_mlp(h, params["w_gate"], params["w_up"], params["w_down"])
    return x, (k, v), load


# The unrolled forward's layers share one trace of the block, inlined: a sampler program traces
# one layer rather than each of them, and compiles to the same instructions (bench/prepare.py).
_shared_decoder_block = jax.jit(decoder_block, static_argnums=(0, 7), inline=True)


@contextlib.contextmanager
def tracing_each_layer():
    """Programs traced within trace the block anew for every layer, as before the shared trace:
    the baseline of `bench/prepare.py`, and the way for a test that patches a module constant
    the block reads (the shared trace of a config and shapes keeps what it was traced with)."""
    global _shared_decoder_block
    shared, _shared_decoder_block = _shared_decoder_block, decoder_block
    try:
        yield
    finally:
        _shared_decoder_block = shared


def block_tracing():
    """How layers trace the decoder block now (the shared trace, or each its own within
    `tracing_each_layer`): programs shared between samplers (`spade_jax.jit_cache`) are keyed
    by it, since their traces depend on it."""
    return _shared_decoder_block


def unrolled_forward(
    model: Transformer,
    layer_params: list[dict[str, jax.Array]],
    tokens: jax.Array,
    positions: jax.Array,
    kv_mask: jax.Array,
    cache: list[tuple[jax.Array, jax.Array]],
    cache_index: jax.Array | int,
    layout: KVLayout = KVLayout.HEAD_MAJOR,
    *,
    stream_weights: bool = False,
    cache_rows: jax.Array | None = None,
) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
    """The cached forward of `Transformer.__call__` with a Python loop over layers.

    The sampler's path: weights come as per-layer arrays (`Transformer.layer_params`) and the
    cache as one (keys, values) pair per layer in `layout`, so no decode step slices
    stacked weights or copies the cache (XLA-CPU materialises the per-layer slices of a scan,
    doubling the bytes moved per token). Same masks and maths as `__call__`. The layers call
    one jitted block, traced once per program rather than once per layer.
    `stream_weights`: each layer's weights pass an optimization barrier with the previous
    layer's input, so their gather over 'fsdp' waits until then: one layer ahead of its use,
    never hoisted out of a loop around this forward, a few layers' gathered weights live.
    `cache_rows`: the cache rows of the tokens' rows, for an extend of only those rows.
    """
    cfg = model.cfg
    dtype = layer_params[0]["attn_norm"].dtype
    # An extend's rows stay split over the batch axes as in training: left to itself, XLA's
    # propagation from FSDP-sharded weights computed every row's activations on every device.
    # A decode step's single token is left to it (it keeps the rows split there, and the
    # constraint cost the TPU decode temporaries).
    split_rows = tokens.shape[1] > 1
    x = jnp.take(model.embed[...], tokens, axis=0).astype(dtype)
    mask = SlotMask(kv_mask, cache_index)
    new_cache = []
    weights = list(layer_params)
    if stream_weights:
        weights[0], x = jax.lax.optimization_barrier((weights[0], x))
    for i, layer_cache in enumerate(cache):
        if split_rows:
            x = constrain(x, ROWS_SPLIT)
        if stream_weights and i + 1 < len(weights):
            weights[i + 1], x = jax.lax.optimization_barrier((weights[i + 1], x))
        x, kv, _ = _shared_decoder_block(cfg, weights[i], x, positions, mask, layer_cache,
                                         cache_index, layout, cache_rows)
        new_cache.append(kv)
    return layers.rms_norm(x, model.final_norm[...], cfg.rms_eps), new_cache


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Rotary positions for left-padded rows: 0 at the first real token, counting up."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward_logits(
    model: Transformer, tokens: jax.Array, mask: jax.Array | None = None
) -> jax.Array:
    """Full-sequence float32 logits [B, T, vocab] for (optionally left-padded) tokens."""
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    hidden = model(tokens, positions_from_mask(mask), kv_mask=mask)
    return model.logits(hidden)
