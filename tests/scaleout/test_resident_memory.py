"""What stays in device memory through both phases, and the TPU compiler's reservation of it.

A chip holds the master weights, the AdamW state, the sampler's bf16 copy and KL's copy through
sampling and training alike, but each program is compiled alone: left to itself the TPU
compiler plans each program for the whole HBM, and its scheduler may fill it. The runtime
therefore compiles every program with `xla_tpu_user_reserved_hbm_bytes` set to what stays
beside it (`ResidentBytes`). The TPU tests compile ahead of time with libtpu (no TPU needed).
"""

import importlib.util

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.plan import tpu_topology_devices
from spade_jax.sampling import Sampler
from spade_jax.sharding import (
    MESH_AXES,
    TPU_RESERVED_HBM_OPTION,
    ResidentBytes,
    make_mesh,
    reserved_memory_options,
)

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu: pip install -e .[tpu]")


def _abstract(mesh, shape, dtype, spec):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))


@pytest.mark.parametrize("compute_dtype, kl", [("bfloat16", False), ("bfloat16", True),
                                               ("float32", False), ("float32", True)])
def test_resident_bytes_count_each_devices_shard_of_the_state_and_its_copies(compute_dtype, kl):
    """Golden bytes on a (1, 4, 2) mesh of 8 CPU devices: a float32 [64, 32] weight split over
    fsdp x tensor (256 elements per device), a replicated float32 [16] norm, an int32 [8]
    table split over fsdp, and two float32 moments like the weight."""
    mesh = make_mesh((1, 4, 2), jax.devices()[:8])
    params = {"w": _abstract(mesh, (64, 32), jnp.float32, ("fsdp", "tensor")),
              "norm": _abstract(mesh, (16,), jnp.float32, ()),
              "table": _abstract(mesh, (8,), jnp.int32, ("fsdp",))}
    moments = [_abstract(mesh, (64, 32), jnp.float32, ("fsdp", "tensor"))] * 2
    resident = ResidentBytes.of(params, moments, compute_dtype, kl=kl)
    masters = 256 * 4 + 16 * 4 + 2 * 4
    copy = (256 * 2 + 16 * 2 if compute_dtype == "bfloat16" else 256 * 4 + 16 * 4) + 2 * 4
    assert resident.masters == masters and resident.optimizer == 2 * 256 * 4
    assert resident.sampler_copy == (copy if compute_dtype == "bfloat16" else 0)
    assert resident.reference == (copy if kl else 0)
    # the sampler runs beside the optimizer state, KL's copy and (where it has its own copy)
    # the masters; the train step beside the sampler's copy
    assert resident.beside_sampler == 2 * 256 * 4 + resident.reference + (
        masters if compute_dtype == "bfloat16" else 0)
    assert resident.beside_train_step == resident.sampler_copy


def test_only_the_tpu_compiler_is_given_a_reservation():
    cpu = make_mesh((1, 1, 1), jax.devices()[:1])
    assert reserved_memory_options(cpu, 2**30) == {}
    assert reserved_memory_options(AbstractMesh((1, 1, 1), MESH_AXES), 2**30) == {}


@needs_libtpu
def test_the_sampler_and_the_train_step_compile_with_the_reservation_on_tpu():
    """Their TPU programs get the option, and the TPU compiler takes it (it refuses an option
    it does not know, so a misspelt one fails here); CPU ones get none."""
    from spade_jax.readiness import abstract_train_state, train_batch
    from spade_jax.rl.trainer import TrainConfig, TrainStep, make_optimizer

    tpu = make_mesh((1, 4, 2), tpu_topology_devices("v5e-8"))
    assert reserved_memory_options(tpu, 5) == {TPU_RESERVED_HBM_OPTION: 5}
    assert reserved_memory_options(tpu, 0) == {}
    cfg = ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4,
                      head_dim=64, ffn_dim=512, qk_norm=True)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(model, mesh=tpu, fuse_weights=False, reserved_bytes=2**30)
    for name, static in (("extend", {"width": 4096}), ("decode", {}),
                         ("grow_layer", {"new_window": 512})):
        assert sampler._compiler_options(name, 8, static) == {TPU_RESERVED_HBM_OPTION: 2**30}
    sampler.lower("decode", 8, 256).compile()
    optimizer = make_optimizer(TrainConfig())
    step = TrainStep(cfg, optimizer, tpu, reserved_bytes=2**30)
    assert step.compiler_options == {TPU_RESERVED_HBM_OPTION: 2**30}
    _, state = abstract_train_state(cfg, optimizer, tpu, "float32")
    step.lower(state, train_batch(8, 128)).compile()
    assert TrainStep(cfg, optimizer, make_mesh((1, 1, 1), jax.devices()[:1]),
                     reserved_bytes=7).compiler_options is None


@pytest.mark.heavy
@needs_libtpu
def test_the_30b_ffn_extend_fits_beside_the_resident_state_on_v5p_64_told_or_not():
    """30B-A3B with FFN-split experts at 32k on v5p-64, its 48-layer extend compiled by the TPU
    compiler (about 2 minutes each, 8 GiB of host memory), told of the 10.9 GiB of optimizer
    state and master weights beside it or planned for the whole 95 GiB: 3.7 GiB of
    temporaries, a 59.5 GiB program, either way. While the extend wrote its block after the
    attention's key-block loop, which then did not depend on it, the compiler copied the
    cache: untold, its scheduler let temporaries reach 32.7 GiB (an 88.5 GiB program, over
    the chip with the resident state), and 5.2 GiB when told."""
    from spade_jax.config import load_config_file, parse
    from spade_jax.readiness import check

    cfg = load_config_file("30b")
    cfg.model.moe_sharding = "ffn"
    run = parse(cfg, 32)
    devices = tpu_topology_devices("v5p-64")
    hbm = 95 * 2**30

    def extend_memory():
        (report,), summary = check(run, 32, layers=None, seq_len=None, micro_batches=1,
                                   devices=devices, programs=("sampler.extend",))
        return report.memory, summary["full_state"]["resident"].beside_sampler

    told, beside = extend_memory()
    with pytest.MonkeyPatch.context() as patch:  # the compiler planning for the whole HBM
        patch.setattr(Sampler, "_compiler_options", lambda self, *program: None)
        untold, _ = extend_memory()
    for memory in (told, untold):
        assert memory["peak"] + beside <= hbm, (memory, beside)
        assert memory["temp"] < 8 * 2**30, memory


def test_the_runtime_compiles_each_phase_for_what_stays_beside_it():
    """The tiny config's runtime: float32 masters with a bf16 sampler copy, no KL."""
    from spade_jax.config import load_config_file, parse
    from spade_jax.sharding import per_device_bytes
    from spade_jax.spade.runtime import Runtime

    cfg = load_config_file("tiny")
    cfg.model.compute_dtype = "bfloat16"
    rt = Runtime.create(parse(cfg, 1), jax.devices()[:1])
    try:
        masters = per_device_bytes(rt.train_state.params)
        optimizer = per_device_bytes(rt.train_state.opt_state)
        assert rt.resident == ResidentBytes(masters, optimizer, per_device_bytes(rt.sampler.state),
                                            0)
        assert rt.sampler.reserved_bytes == optimizer + masters
        assert rt.train_step.compiler_options is None  # on CPU nothing is reserved
    finally:
        rt.close()
