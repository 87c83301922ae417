"""Checkpoint import/export (GGUF, HF safetensors) and tokenizers with chat templates."""

from spade_jax.weights.gguf import load_gguf, smollm2_gguf_path
from spade_jax.weights.safetensors_io import load_hf_config, load_hf_model, save_hf
from spade_jax.weights.tokenizer import format_chat, load_tokenizer

__all__ = [
    "format_chat",
    "load_gguf",
    "load_hf_config",
    "load_hf_model",
    "load_tokenizer",
    "save_hf",
    "smollm2_gguf_path",
]
