"""One Flax NNX decoder for Llama (SmolLM2), Qwen3 dense and Qwen3-MoE.

Layer parameters are stacked on a leading `layers` axis and the forward pass is a `lax.scan`
over them (fast compiles at 48+ layers, one checkpoint layout). Every parameter carries its
logical PartitionSpec over the mesh axes ('data', 'fsdp', 'tensor') as NNX metadata; see
`spade_jax.sharding` for how specs are fitted to a concrete mesh.

Mixture of experts: experts are stacked [E, D, F] and sharded over 'tensor' (the expert axis
doubles as the tensor axis). The CPU path evaluates all experts densely and weights them by the
router (exact); on a sharded mesh XLA turns the weighted sum over E into a reduction across the
'tensor' axis. A routed kernel with all-to-all dispatch is the TPU/GPU speed path and is not
implemented yet.
"""

from __future__ import annotations

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from spade_jax.models import layers
from spade_jax.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """Keys and values of every layer: [layers, batch, slots, kv_heads, head_dim]."""

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, slots: int, dtype=jnp.float32) -> "KVCache":
        shape = (cfg.n_layers, batch, slots, cfg.n_kv_heads, cfg.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

    @property
    def slots(self) -> int:
        return self.k.shape[2]


def _param(rngs: nnx.Rngs, shape, spec, dtype, scale=0.02) -> nnx.Param:
    value = scale * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, sharding_names=spec, eager_sharding=False)


def _ones(shape, spec, dtype) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, dtype), sharding_names=spec, eager_sharding=False)


class Transformer(nnx.Module):
    """Decoder-only transformer; `__call__` returns final-norm hidden states and the cache."""

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
            self.w_gate = p((L, E, D, F), (None, "tensor", "fsdp", None))
            self.w_up = p((L, E, D, F), (None, "tensor", "fsdp", None))
            self.w_down = p((L, E, F, D), (None, "tensor", None, "fsdp"))
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
        cache: KVCache | None = None,
        cache_index: jax.Array | int = 0,
        compute_dtype=None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Run the decoder on `tokens` [B, T] at rotary `positions` [B, T].

        Without a cache, attention is causal over the T tokens and `kv_mask` [B, T] marks real
        (non-padding) tokens. With a cache, the T new keys/values are written to slots
        [cache_index, cache_index + T) and `kv_mask` [B, slots] marks the slots that hold real
        tokens (the new ones included); a query in slot i sees valid slots <= i.
        Returns hidden states [B, T, D] after the final norm, and the updated cache.
        """
        cfg = self.cfg
        dtype = compute_dtype or self.embed.dtype
        batch, length = tokens.shape
        x = jnp.take(self.embed[...], tokens, axis=0).astype(dtype)

        if cache is None:
            causal = jnp.tril(jnp.ones((length, length), bool))
            mask = causal[None] & kv_mask[:, None, :]
        else:
            query_slot = cache_index + jnp.arange(length)
            key_slot = jnp.arange(cache.slots)
            causal = key_slot[None, :] <= query_slot[:, None]
            mask = causal[None] & kv_mask[:, None, :]

        def block(x, scanned):
            params, layer_k, layer_v = scanned
            params = jax.tree.map(lambda a: a.astype(dtype), params)
            h = layers.rms_norm(x, params["attn_norm"], cfg.rms_eps)
            q = jnp.einsum("btd,dhk->bthk", h, params["wq"])
            k = jnp.einsum("btd,dhk->bthk", h, params["wk"])
            v = jnp.einsum("btd,dhk->bthk", h, params["wv"])
            if cfg.qk_norm:
                q = layers.rms_norm(q, params["q_norm"], cfg.rms_eps)
                k = layers.rms_norm(k, params["k_norm"], cfg.rms_eps)
            q = layers.apply_rope(q, positions, cfg.rope_theta)
            k = layers.apply_rope(k, positions, cfg.rope_theta)
            if layer_k is not None:
                k = jax.lax.dynamic_update_slice_in_dim(layer_k, k.astype(layer_k.dtype), cache_index, 1)
                v = jax.lax.dynamic_update_slice_in_dim(layer_v, v.astype(layer_v.dtype), cache_index, 1)
            attn = layers.attention(q, k.astype(dtype), v.astype(dtype), mask)
            x = x + jnp.einsum("bthk,hkd->btd", attn, params["wo"])
            h = layers.rms_norm(x, params["mlp_norm"], cfg.rms_eps)
            if cfg.is_moe:
                x = x + layers.moe_mlp_dense(
                    h, params["router"], params["w_gate"], params["w_up"], params["w_down"],
                    cfg.n_experts_per_tok, cfg.norm_topk_prob,
                )
            else:
                x = x + layers.swiglu_mlp(h, params["w_gate"], params["w_up"], params["w_down"])
            return x, (k, v) if layer_k is not None else None

        scanned = (
            self._layer_params(),
            None if cache is None else cache.k,
            None if cache is None else cache.v,
        )
        x, new_kv = jax.lax.scan(block, x, scanned)
        hidden = layers.rms_norm(x, self.final_norm[...], cfg.rms_eps)
        new_cache = None if cache is None else KVCache(k=new_kv[0], v=new_kv[1])
        return hidden, new_cache

    def unembedding(self) -> jax.Array:
        """The [D, vocab] output projection (the transposed embedding when tied)."""
        return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., vocab] of hidden states [..., D]."""
        w = self.unembedding()
        return jnp.einsum("...d,dv->...v", hidden, w.astype(hidden.dtype),
                          preferred_element_type=jnp.float32)


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Rotary positions for left-padded rows: 0 at the first real token, counting up."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward_logits(model: Transformer, tokens: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Full-sequence float32 logits [B, T, vocab] for (optionally left-padded) tokens."""
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    hidden, _ = model(tokens, positions_from_mask(mask), kv_mask=mask)
    return model.logits(hidden)
