"""The TPU compiler keeps the sequence-major KV cache in place (ahead of time, no TPU needed).

Handed the CPU's head-major cache, the TPU compiler copies every layer's keys and values into
its preferred layout and back around the decode loop: its temporary buffers approach the whole
cache. In the sequence-major layout the sampler picks for TPU meshes they stay a small
fraction of it. Needs libtpu (`pip install -e .[tpu]`, part of the test extras).
"""

import dataclasses
import importlib.util

import flax.nnx as nnx
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.moe import MoeSharding
from spade_jax.models.transformer import Transformer
from spade_jax.plan import tpu_topology_devices
from spade_jax.sampling import Sampler
from spade_jax.sharding import make_mesh

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="needs libtpu: pip install -e .[tpu]")

CFG = ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4,
                  head_dim=128, ffn_dim=512, qk_norm=True)
BATCH, WINDOW = 16, 8192


def _tpu_sampler(layout, decode_attention="auto"):
    """A bf16 sampler of CFG over a v5p-8 mesh (fsdp 2, tensor 2), its cache in `layout`."""
    devices = tpu_topology_devices("v5p-8")
    mesh = make_mesh((1, 2, 2), devices)
    cfg = CFG.replace(decode_attention=decode_attention)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    assert devices[0].platform == "tpu" and Sampler(
        model, mesh=mesh, fuse_weights=False).kv_layout is KVLayout.SEQUENCE_MAJOR
    return Sampler(model, mesh=mesh, fuse_weights=False, compute_dtype="bfloat16",
                   kv_layout=layout)


def _compiled_decode(layout, draft_tokens=0, decode_attention="auto"):
    return _tpu_sampler(layout, decode_attention).lower(
        "decode", BATCH, WINDOW, draft_tokens=draft_tokens).compile()


def _cache_bytes():
    """One device's share of the bf16 cache over the v5p-8 mesh's 4 devices."""
    return CFG.n_layers * 2 * BATCH * WINDOW * CFG.n_kv_heads * CFG.head_dim * 2 / 4


def _decode_temp_and_cache_bytes(layout):
    memory = _compiled_decode(layout).memory_analysis()
    return memory.temp_size_in_bytes, _cache_bytes()


def test_tpu_decode_keeps_the_sequence_major_cache_in_place():
    temp, cache = _decode_temp_and_cache_bytes(KVLayout.SEQUENCE_MAJOR)
    assert temp < 0.25 * cache, (temp, cache)
    copied, _ = _decode_temp_and_cache_bytes(KVLayout.HEAD_MAJOR)
    assert copied > 0.5 * cache, (copied, cache)  # the copies this layout exists to avoid


def test_tpu_decode_with_drafts_keeps_the_cache_in_place_and_attends_with_the_ragged_kernel():
    """Each step writes a row's pending token and its 4 drafts (5 slots) from its own slot.
    Its attention is the Pallas ragged decode (model.decode_attention auto), compiled by
    Mosaic, one call per layer; without the XLA decode's float32 scores of every row against
    the whole window its temporaries are a fraction of that one's."""
    ragged, xla = (_compiled_decode(KVLayout.SEQUENCE_MAJOR, 4, kind) for kind in ("auto", "xla"))
    temps = [c.memory_analysis().temp_size_in_bytes for c in (ragged, xla)]
    assert temps[0] < 0.25 * _cache_bytes(), (temps[0], _cache_bytes())
    calls = [text.count("custom_call_target=\"tpu_custom_call\"")
             for text in (ragged.as_text(), xla.as_text())]
    assert calls == [CFG.n_layers, 0], calls
    print(f"drafts decode temporaries, ragged / xla: {temps[0] / 2**20:.1f} / "
          f"{temps[1] / 2**20:.1f} MiB")
    assert temps[0] < 0.5 * temps[1], temps


def test_tpu_extend_keeps_the_cache_in_place():
    """An extend of 256 tokens per row writes each row's block at its own slots and then
    attends: no copy of a layer's keys or values in the compiled program (when the block was
    staged, attended and then moved, the TPU compiler copied two of them)."""
    hlo = _tpu_sampler(KVLayout.SEQUENCE_MAJOR).lower(
        "extend", BATCH, WINDOW, width=256).compile().as_text()
    layer = f"bf16[{BATCH // 2},{WINDOW},{CFG.n_kv_heads // 2},{CFG.head_dim}]"  # per device
    assert f"= {layer}" in hlo
    copies = [line for line in hlo.splitlines() if f"= {layer}" in line and " copy(" in line]
    assert not copies, copies[:2]


MOE = ModelConfig(vocab_size=512, d_model=1024, n_layers=4, n_heads=8, n_kv_heads=4,
                  head_dim=64, ffn_dim=512, qk_norm=True, n_experts=8, n_experts_per_tok=2,
                  expert_ffn_dim=2048, family="qwen3_moe")


@pytest.mark.parametrize("moe_sharding", list(MoeSharding))
def test_per_step_decode_weights_keep_the_gathered_experts_out_of_the_tpu_decode(moe_sharding):
    """On a v5e-8 mesh (1, 4, 2), compiled by the TPU compiler: with resident weights it hoists
    the layers' all-gathers of their experts over 'fsdp' out of the decode loop, so the loop's
    temporaries hold the gathered experts (half of them on a 'tensor' rank) of all the layers
    but one or two; per step it gathers them inside the loop, a layer ahead of their use, and
    its temporaries hold about one layer's. (4 layers keep the compilations short, half the
    time of 8, where the shares were alike; at 16 the resident share was larger.)"""
    from spade_jax.sampling import DecodeWeights

    mesh = make_mesh((1, 4, 2), tpu_topology_devices("v5e-8"))
    model = nnx.eval_shape(lambda: Transformer(
        dataclasses.replace(MOE, moe_sharding=moe_sharding), rngs=nnx.Rngs(0)))

    def decode_temp(decode_weights):
        sampler = Sampler(model, mesh=mesh, fuse_weights=False, compute_dtype="bfloat16",
                          decode_weights=decode_weights)
        return sampler.lower("decode", 8, 256).compile().memory_analysis().temp_size_in_bytes

    gathered_experts = MOE.n_layers * 3 * (MOE.n_experts // 2) * MOE.d_model * \
        MOE.expert_ffn_dim * 2  # bf16 per device
    resident, per_step = decode_temp(DecodeWeights.RESIDENT), decode_temp(DecodeWeights.PER_STEP)
    layer_bytes = gathered_experts / MOE.n_layers
    resident_layers, per_step_layers = resident / layer_bytes, per_step / layer_bytes
    print(f"{moe_sharding.name}: layers of gathered experts held, resident / per step: "
          f"{resident_layers:.2f} / {per_step_layers:.2f} of {MOE.n_layers}")
    assert resident_layers > MOE.n_layers - 2, (resident, layer_bytes)
    assert per_step_layers < MOE.n_layers / 2, (per_step, layer_bytes)
