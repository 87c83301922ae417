"""The TPU compiler keeps the sequence-major KV cache in place (ahead of time, no TPU needed).

Handed the CPU's head-major cache, the TPU compiler copies every layer's keys and values into
its preferred layout and back around the decode loop: its temporary buffers approach the whole
cache. In the sequence-major layout the sampler picks for TPU meshes they stay a small
fraction of it. Needs libtpu (`pip install -e .[tpu]`, part of the test extras).
"""

import importlib.util

import flax.nnx as nnx
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.transformer import Transformer
from spade_jax.plan import tpu_topology_devices
from spade_jax.sampling import Sampler
from spade_jax.sharding import make_mesh

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="needs libtpu: pip install -e .[tpu]")

CFG = ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4,
                  head_dim=128, ffn_dim=512, qk_norm=True)
BATCH, WINDOW = 16, 8192


def _decode_temp_and_cache_bytes(layout):
    devices = tpu_topology_devices("v5p-8")
    mesh = make_mesh((1, 2, 2), devices)
    model = nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0)))
    sampler = Sampler(model, mesh=mesh, fuse_weights=False, compute_dtype="bfloat16",
                      kv_layout=layout)
    assert devices[0].platform == "tpu" and Sampler(
        model, mesh=mesh, fuse_weights=False).kv_layout is KVLayout.SEQUENCE_MAJOR
    memory = sampler.lower("decode", BATCH, WINDOW).compile().memory_analysis()
    per_device_cache = CFG.n_layers * 2 * BATCH * WINDOW * CFG.n_kv_heads * CFG.head_dim * 2 / 4
    return memory.temp_size_in_bytes, per_device_cache


def test_tpu_decode_keeps_the_sequence_major_cache_in_place():
    temp, cache = _decode_temp_and_cache_bytes(KVLayout.SEQUENCE_MAJOR)
    assert temp < 0.25 * cache, (temp, cache)
    copied, _ = _decode_temp_and_cache_bytes(KVLayout.HEAD_MAJOR)
    assert copied > 0.5 * cache, (copied, cache)  # the copies this layout exists to avoid
