"""Where each of our stacked parameters lives in a Hugging Face checkpoint, and how to convert.

Our Transformer stacks layers (and experts) on leading axes and stores projections as
`x @ W` matrices split into heads, e.g. `wq` [L, D, H, Dh]. HF stores one `nn.Linear.weight`
[out, in] per layer (and per expert), e.g. `model.layers.3.self_attn.q_proj.weight` [H*Dh, D].
A `LeafLayout` records that correspondence once, and is used both ways: importing reads any
rectangular block of our leaf from the HF tensors (so each device reads only its shard), and
exporting turns one layer's block back into HF tensors. GGUF import goes through the same
tables after renaming GGUF tensors to HF names.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np

from spade_jax.models.config import ModelConfig

# Reads `slices` of the named HF tensor (a tuple of slices, one per HF dimension).
ReadFn = Callable[[str, tuple[slice, ...]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class LeafLayout:
    """One parameter of ours as a stack of transposed, reshaped HF tensors.

    `hf_key` is a template with `{layer}` / `{expert}` for the stacked axes named in `stacked`.
    `hf_view` splits each HF dimension into sub-dimensions (row-major), e.g. q_proj's rows
    into (H, Dh); our per-layer block is the flattened view transposed by `perm`.
    """

    hf_key: str
    hf_view: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]
    stacked: tuple[str, ...] = ()

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(group) for group in self.hf_view)

    def keys(self, cfg: ModelConfig) -> Iterator[tuple[tuple[int, ...], str]]:
        """Every (stack index, HF key) this leaf is made of, layers then experts."""
        ranges = [range(_stack_size(cfg, axis)) for axis in self.stacked]
        for index in itertools.product(*ranges):
            yield index, self.hf_key.format(**dict(zip(self.stacked, index, strict=True)))

    def read_block(self, read: ReadFn, key: str, block_slices: tuple[slice, ...]) -> np.ndarray:
        """Our block `block_slices` (one slice per block axis) read from HF tensor `key`."""
        view_slices: list[slice] = [slice(None)] * len(self.perm)
        for axis, view_axis in enumerate(self.perm):
            view_slices[view_axis] = block_slices[axis]
        hf_slices, view_shape, inner_slices, pos = [], [], [], 0
        for group in self.hf_view:
            sub = view_slices[pos : pos + len(group)]
            inner = math.prod(group[1:])
            hf_slices.append(slice(sub[0].start * inner, sub[0].stop * inner))
            view_shape += [sub[0].stop - sub[0].start, *group[1:]]
            inner_slices += [slice(None), *sub[1:]]
            pos += len(group)
        block = np.asarray(read(key, tuple(hf_slices))).reshape(view_shape)
        return block[tuple(inner_slices)].transpose(self.perm)

    def to_hf(self, block: np.ndarray) -> np.ndarray:
        """One full per-layer (per-expert) block of ours as the HF tensor."""
        flat_view = block.transpose(np.argsort(self.perm))
        return flat_view.reshape(self.hf_shape)


def _stack_size(cfg: ModelConfig, axis: str) -> int:
    return {"layer": cfg.n_layers, "expert": cfg.n_experts}[axis]


def leaf_layouts(cfg: ModelConfig) -> dict[str, LeafLayout]:
    """The HF layout of every parameter of a `Transformer(cfg)`, keyed by our attribute name."""
    V, D, H, K, Dh = cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    layer = "model.layers.{layer}."
    per_layer = ("layer",)
    layouts = {
        "embed": LeafLayout("model.embed_tokens.weight", ((V,), (D,)), (0, 1)),
        "final_norm": LeafLayout("model.norm.weight", ((D,),), (0,)),
        "attn_norm": LeafLayout(layer + "input_layernorm.weight", ((D,),), (0,), per_layer),
        "mlp_norm": LeafLayout(
            layer + "post_attention_layernorm.weight", ((D,),), (0,), per_layer
        ),
        "wq": LeafLayout(layer + "self_attn.q_proj.weight", ((H, Dh), (D,)), (2, 0, 1), per_layer),
        "wk": LeafLayout(layer + "self_attn.k_proj.weight", ((K, Dh), (D,)), (2, 0, 1), per_layer),
        "wv": LeafLayout(layer + "self_attn.v_proj.weight", ((K, Dh), (D,)), (2, 0, 1), per_layer),
        "wo": LeafLayout(layer + "self_attn.o_proj.weight", ((D,), (H, Dh)), (1, 2, 0), per_layer),
    }
    if not cfg.tie_embeddings:
        layouts["lm_head"] = LeafLayout("lm_head.weight", ((V,), (D,)), (1, 0))
    if cfg.qk_norm:
        layouts["q_norm"] = LeafLayout(layer + "self_attn.q_norm.weight", ((Dh,),), (0,), per_layer)
        layouts["k_norm"] = LeafLayout(layer + "self_attn.k_norm.weight", ((Dh,),), (0,), per_layer)
    if cfg.is_moe:
        E, F = cfg.n_experts, cfg.expert_ffn_dim
        expert = layer + "mlp.experts.{expert}."
        per_expert = ("layer", "expert")
        layouts["router"] = LeafLayout(layer + "mlp.gate.weight", ((E,), (D,)), (1, 0), per_layer)
        fd, df = ((F,), (D,)), ((D,), (F,))
        layouts["w_gate"] = LeafLayout(expert + "gate_proj.weight", fd, (1, 0), per_expert)
        layouts["w_up"] = LeafLayout(expert + "up_proj.weight", fd, (1, 0), per_expert)
        layouts["w_down"] = LeafLayout(expert + "down_proj.weight", df, (1, 0), per_expert)
    else:
        F, mlp = cfg.ffn_dim, layer + "mlp."
        layouts["w_gate"] = LeafLayout(mlp + "gate_proj.weight", ((F,), (D,)), (1, 0), per_layer)
        layouts["w_up"] = LeafLayout(mlp + "up_proj.weight", ((F,), (D,)), (1, 0), per_layer)
        layouts["w_down"] = LeafLayout(mlp + "down_proj.weight", ((D,), (F,)), (1, 0), per_layer)
    return layouts
