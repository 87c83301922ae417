"""Memory plan: per-device HBM for a config on a TPU slice, from abstract shapes and real specs.

    python -m spade_jax.plan --config=configs/30b.py --topology=v5p-64
    python -m spade_jax.plan --config=configs/8b.py --devices=16 --hbm-gib=32
    python -m spade_jax.plan --config=configs/30b.py --topology=v5p-64 --compiled
    python -m spade_jax.plan --config=configs/30b.py --topology=v5p-64 --compiled \
        --compiled_layers=2

`--compiled` adds the plan derived from the code itself (`spade_jax.compiled_plan`): XLA's
per-device memory analysis of the compiled train step and sampler programs at the config's
true widths and depth, plus the resident state; `--compiled_layers=N` compiles them at N and
N + 1 layers instead and extrapolates per layer (quicker, but it overstates programs whose
temporaries stop growing with depth). With libtpu installed
(`pip install -e .[tpu]`; no TPU needed) the programs are compiled ahead of time by the TPU
compiler for the slice's topology (`tpu_topology_devices`), which is the buffer assignment a
pod run gets; otherwise (or with --compile_for=cpu) on as many fake CPU devices as the slice
has chips, whose compiler keeps float32 copies of bf16 operands (whole KV-cache layers, expert
weights) that a TPU does not (minutes for 30B on a CPU host either way). Where the config
does not fit (analytic or compiled), the plan names the other `--config.mesh.tensor` widths
whose analytic plan fits the slice (`tensor_alternatives`) and, for a MoE, whether gathering
the decode's weights every step would (`per_step_alternative`), to check with `--compiled`.

Nothing is allocated: the model is built with `nnx.eval_shape`, and each parameter's spec is
fitted to an `AbstractMesh` of the configured (data, fsdp, tensor) shape exactly as on real
devices, so per-device parameter, gradient and AdamW bytes follow the real shardings. Master
weights (param_dtype, float32), both Adam moments and the gradient sums are float32; the
sampler keeps its own compute-dtype copy of the weights when that dtype differs, and KL
(train.kl_coef > 0) a frozen compute-dtype reference copy. The KV cache (sampler batch x
context, compute dtype) and training activations (one micro-batch, under the remat policy) are
computed from the shapes our decoder materialises. Sampling and training alternate on the same
devices, so the peak is the larger of the two phases; both keep the weights, their copies and
the optimizer state resident.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh

from spade_jax.cli import run
from spade_jax.errors import ConfigError
from spade_jax.models.attention import ATTENTION_QUERY_CHUNK
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.trainer import Remat
from spade_jax.sampling.programs import DecodeWeights
from spade_jax.sharding import MESH_AXES, fit_spec, kv_cache_axes

GIB = 1 << 30
# name prefix -> (HBM GiB per chip, chips per unit of the name's number)
TOPOLOGIES = {"v4": (32, 0.5), "v5e": (16, 1.0), "v5litepod": (16, 1.0), "v5p": (95, 0.5),
              "v6e": (32, 1.0)}
LOGITS_CHUNK = 1024  # tokens per log-prob chunk of the train step (never the full B x T x V)


def _topology_dims(chips: int, rank: int) -> list[int]:
    """A slice's chip grid: `chips` (a power of two) over `rank` axes as evenly as possible,
    the smaller axes first (v5p 32 chips: 2x4x4; v5e 16 chips: 4x4), except that a 3-D slice
    under 8 chips fills its first axes (one host's 2x2x1 chips: v5p-8 is 2x2x1)."""
    if chips < 1 or chips & (chips - 1):
        raise ConfigError(f"a TPU topology of {chips} chips: use a power of two")
    exponents = [0] * rank
    for i in range(chips.bit_length() - 1):
        exponents[-1 - i % rank] += 1
    dims = sorted(1 << e for e in exponents)
    return dims[::-1] if rank == 3 and chips < 8 else dims


def tpu_topology_devices(name: str) -> list:
    """The devices of TPU slice `name` (e.g. v5p-64) from libtpu's topology description: no
    TPU needed, enough to compile programs for it ahead of time (`jax.jit(...).lower(...)
    .compile()` gives the TPU compiler's memory analysis). Needs libtpu (`pip install -e
    .[tpu]`); a ConfigError says so when it is missing."""
    if importlib.util.find_spec("libtpu") is None:
        raise ConfigError("compiling for a TPU topology needs libtpu: pip install -e .[tpu] "
                          "(or use --compile_for=cpu)")
    chips, _ = topology_devices(name)
    generation = name.split("-")[0].replace("v5litepod", "v5e")
    rank = 3 if generation in ("v4", "v5p") else 2
    # a CPU host: no metadata server to ask, and other processes may hold libtpu too
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    shape = "x".join(map(str, _topology_dims(chips, rank)))
    # v4's two TensorCores per chip are separate devices unless asked for as one (megacore),
    # which is what JAX's meshes need; v5p's are one device already
    chip_config = {"chip_config_name": "megacore"} if generation == "v4" else {}
    return list(topologies.get_topology_desc(platform="tpu", topology_name=f"{generation}:{shape}",
                                             **chip_config).devices)


def topology_devices(name: str) -> tuple[int, float]:
    """(chips, HBM GiB per chip) of a slice name like v5p-64 (v4 and v5p count cores: 2 per
    chip)."""
    match = re.fullmatch(r"(v4|v5e|v5litepod|v5p|v6e)-(\d+)", name)
    if match is None:
        raise ConfigError(
            f"unknown topology {name!r}: use v4-N, v5e-N, v5p-N or v6e-N (e.g. v5p-64), or "
            "pass --devices=N --hbm-gib=G"
        )
    hbm, chips_per_unit = TOPOLOGIES[match.group(1)]
    return max(1, int(int(match.group(2)) * chips_per_unit)), float(hbm)


@dataclasses.dataclass(frozen=True)
class TrainShape:
    """What the plan needs besides the architecture: dtypes, mesh, batch sizes, remat."""

    param_dtype: str
    compute_dtype: str
    mesh: tuple[int, int, int]
    remat: Remat
    micro_batch: int
    seq_len: int
    rollout_batch: int
    context_len: int
    reference_copy: bool = False  # KL on: a frozen compute-dtype copy of the initial weights
    decode_weights: DecodeWeights = DecodeWeights.RESIDENT  # sampling.decode_weights


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of each component, and the peaks of the two phases."""

    n_params: int
    parameters: int
    optimizer: int
    gradients: int
    kv_cache: int
    activations: int
    attention_scores: int
    sampler_weights: int = 0  # the sampler's compute-dtype copy (0: it shares the masters)
    reference_weights: int = 0  # KL's frozen reference copy
    # where the cache's batch is not split over devices: the copy of at most half its rows
    # that a session's row-subset programs (extend_rows, decode_rows) gather
    kv_row_copy: int = 0
    # the decode's MoE expert weights gathered over fsdp (compute dtype): every layer's where
    # they stay resident through the decode loop, two layers' where each step gathers them
    decode_gathered_weights: int = 0

    @property
    def resident(self) -> int:
        """What both phases hold: master weights, optimizer state and the weight copies."""
        return self.parameters + self.optimizer + self.sampler_weights + self.reference_weights

    @property
    def sampling_peak(self) -> int:
        return self.resident + self.kv_cache + self.kv_row_copy + self.decode_gathered_weights

    @property
    def training_peak(self) -> int:
        return self.resident + self.gradients + self.activations

    @property
    def peak(self) -> int:
        return max(self.sampling_peak, self.training_peak)


def _per_device_elements(shape, spec, mesh: AbstractMesh) -> int:
    fitted = fit_spec(spec, shape, mesh)
    shards = 1
    for axes in fitted:
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        shards *= math.prod(mesh.shape[a] for a in names)
    return math.prod(shape) // shards


def _without_axis(spec, axis: str) -> tuple:
    """`spec` with mesh axis `axis` dropped from every entry."""
    names = lambda e: (e,) if isinstance(e, str) else tuple(e or ())  # noqa: E731
    return tuple(tuple(a for a in names(e) if a != axis) or None for e in spec)


EXPERT_WEIGHTS = frozenset({"w_gate", "w_up", "w_down"})


def decode_gathered_weights(cfg: ModelConfig, shape: TrainShape, state, specs,
                            mesh: AbstractMesh) -> int:
    """Per-device bytes of the MoE experts' weights a decode holds gathered over fsdp (0
    without experts or fsdp): every layer's with `DecodeWeights.RESIDENT`, two layers' with
    PER_STEP. The TPU compiler hoists those gathers (the expert `shard_map` takes its weights
    whole over fsdp) out of the decode loop; a dense layer's weights it gathers in the loop."""
    if not cfg.is_moe or mesh.shape["fsdp"] == 1:
        return 0
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    gathered = sum(
        _per_device_elements(x.shape, _without_axis(spec, "fsdp"), mesh)
        for (path, x), spec in zip(jax.tree_util.tree_leaves_with_path(state),
                                   jax.tree.leaves(specs, is_leaf=is_spec), strict=True)
        if path[0].key in EXPERT_WEIGHTS)
    gathered *= np.dtype(jnp.dtype(shape.compute_dtype)).itemsize
    return gathered * 2 // cfg.n_layers if shape.decode_weights.streams else gathered


def memory_plan(cfg: ModelConfig, shape: TrainShape) -> MemoryPlan:
    """Per-device memory of training `cfg` with `shape` (see the module docstring)."""
    if shape.remat not in tuple(Remat):
        raise ConfigError(f"train.remat={shape.remat!r}: use one of {tuple(Remat)}")
    mesh = AbstractMesh(shape.mesh, MESH_AXES)
    data, fsdp, tensor = shape.mesh
    param_bytes = np.dtype(jnp.dtype(shape.param_dtype)).itemsize
    act_bytes = np.dtype(jnp.dtype(shape.compute_dtype)).itemsize
    abstract = nnx.eval_shape(
        lambda: Transformer(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.dtype(shape.param_dtype))
    )
    state = nnx.state(abstract)
    specs = nnx.get_partition_spec(state)
    leaves = jax.tree.leaves(state)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    spec_leaves = jax.tree.leaves(specs, is_leaf=is_spec)
    n_params = sum(math.prod(x.shape) for x in leaves)
    local = sum(
        _per_device_elements(x.shape, s, mesh) for x, s in zip(leaves, spec_leaves, strict=True)
    )

    # KV cache [L, B, S, K, Dh] x (k, v), split as the sampler splits it (kv_cache_axes), its
    # batch padded to a multiple of the shards as the sampler's Session pads it.
    batch_axes, head_axis = kv_cache_axes(cfg.n_kv_heads, mesh.shape)
    shards = math.prod(mesh.shape[a] for a in batch_axes)
    rows = -(-shape.rollout_batch // shards) * shards
    kv_shape = (cfg.n_layers, rows, shape.context_len, cfg.n_kv_heads, cfg.head_dim)
    kv_spec = (None, batch_axes, None, head_axis, None)
    kv = 2 * _per_device_elements(kv_shape, kv_spec, mesh) * act_bytes

    # Activations of one micro-batch: sequences over (data, fsdp), features/heads over tensor.
    seqs = math.ceil(shape.micro_batch / (data * fsdp))
    tokens = seqs * shape.seq_len
    heads = cfg.n_heads // tensor if cfg.n_heads % tensor == 0 else cfg.n_heads
    mlp_width = cfg.n_experts_per_tok * cfg.expert_ffn_dim if cfg.is_moe else cfg.ffn_dim
    per_token = 4 * cfg.d_model + (3 * cfg.n_heads + 4 * cfg.n_kv_heads) * cfg.head_dim
    per_token += 3 * mlp_width + (cfg.n_experts if cfg.is_moe else 0)
    layer_working_set = tokens * per_token * act_bytes // tensor
    # f32 scores and probabilities of one query chunk against its keys: the XLA path's forward
    # and its flash-style backward hold one chunk at a time and keep no scores between them
    # (splash and cuDNN hold less).
    attention_scores = 2 * seqs * heads * min(ATTENTION_QUERY_CHUNK, shape.seq_len) * \
        shape.seq_len * 4
    if Remat(shape.remat).recompute_layers:  # each layer keeps its input; one layer's
        # intermediates live
        activations = cfg.n_layers * tokens * cfg.d_model * act_bytes // tensor
        activations += layer_working_set + attention_scores
    else:
        activations = cfg.n_layers * layer_working_set + attention_scores
    vocab_local = cfg.vocab_size // tensor if cfg.vocab_size % tensor == 0 else cfg.vocab_size
    activations += 2 * min(tokens, LOGITS_CHUNK) * vocab_local * 4
    return MemoryPlan(
        n_params=n_params,
        parameters=local * param_bytes,
        optimizer=2 * local * 4,
        gradients=local * 4,
        kv_cache=kv,
        activations=activations,
        attention_scores=attention_scores,
        sampler_weights=local * act_bytes if act_bytes != param_bytes else 0,
        reference_weights=local * act_bytes if shape.reference_copy else 0,
        kv_row_copy=kv // 2 if shards == 1 else 0,
        decode_gathered_weights=decode_gathered_weights(cfg, shape, state, specs, mesh),
    )


def rollout_step(cfg: ModelConfig, shape: TrainShape) -> tuple[int, MemoryPlan]:
    """(rows per step of the sampler batch: the axes the KV cache's batch is split over, the
    plan of one such step)."""
    sizes = dict(zip(MESH_AXES, shape.mesh, strict=True))
    step = math.prod(sizes[a] for a in kv_cache_axes(cfg.n_kv_heads, sizes)[0])
    return step, memory_plan(cfg, dataclasses.replace(shape, rollout_batch=step))


def max_rollout_batch(cfg: ModelConfig, shape: TrainShape, hbm_bytes: int) -> int:
    """Largest sampler batch (a multiple of the axes the KV cache's batch is split over)
    whose sampling peak fits `hbm_bytes`."""
    step, one = rollout_step(cfg, shape)
    per_step = one.kv_cache + one.kv_row_copy
    free = hbm_bytes - (one.sampling_peak - per_step)  # what does not grow with the batch
    return max(0, free // per_step) * step if per_step else 0


def format_plan(cfg: ModelConfig, shape: TrainShape, plan: MemoryPlan, hbm_gib: float) -> str:
    """A human-readable report of `plan` with its verdict against `hbm_gib` per device."""
    g = lambda b: f"{b / GIB:9.2f} GiB"  # noqa: E731
    hbm = hbm_gib * GIB
    data, fsdp, tensor = shape.mesh
    moe = " (routed top-k expert activations)" if cfg.is_moe else ""
    lines = [
        f"model {cfg.family}: {plan.n_params / 1e9:.2f}B parameters in {shape.param_dtype}, "
        f"compute {shape.compute_dtype}",
        f"mesh data={data} fsdp={fsdp} tensor={tensor} ({data * fsdp * tensor} devices, "
        f"{hbm_gib:g} GiB HBM each)",
        "per device:",
        f"  parameters        {g(plan.parameters)}",
        f"  optimizer (AdamW) {g(plan.optimizer)}   2 moments in float32",
        f"  sampler weights   {g(plan.sampler_weights)}   copy in {shape.compute_dtype} "
        "(0: shares the master weights)",
        f"  KL reference      {g(plan.reference_weights)}   frozen initial weights "
        f"({'train.kl_coef > 0' if shape.reference_copy else 'KL off'})",
        f"  gradients         {g(plan.gradients)}   float32 sums",
        f"  kv cache          {g(plan.kv_cache)}   {shape.rollout_batch} sequences x "
        f"{shape.context_len} tokens",
        f"  kv row copy       {g(plan.kv_row_copy)}   half the cache's rows, where its batch "
        "is not split (0: split)",
        f"  decode experts    {g(plan.decode_gathered_weights)}   experts gathered over fsdp "
        f"(sampling.decode_weights={shape.decode_weights})",
        f"  activations       {g(plan.activations)}   remat={shape.remat}, micro-batch "
        f"{shape.micro_batch} x {shape.seq_len} tokens{moe}",
        f"    of which attention scores {g(plan.attention_scores)} (one query chunk of "
        f"{ATTENTION_QUERY_CHUNK} at a time)",
        f"  sampling peak     {g(plan.sampling_peak)}   weights and copies + optimizer + kv cache "
        "(+ row copy) + decode experts",
        f"  training peak     {g(plan.training_peak)}   weights and copies + optimizer + "
        "gradients + activations",
    ]
    verdict = "fits" if plan.peak <= hbm else "does NOT fit"
    lines.append(f"verdict: {verdict} ({plan.peak / GIB:.1f} of {hbm_gib:g} GiB per device)")
    if plan.sampling_peak > hbm:
        lines.append(
            f"  largest rollout batch that fits: {max_rollout_batch(cfg, shape, int(hbm))} "
            f"sequences at {shape.context_len} tokens"
        )
    return "\n".join(lines)


def plan_from_config(run, n_devices: int) -> tuple[ModelConfig, TrainShape]:
    """The architecture and TrainShape of a `RunConfig` (spade_jax.config.parse) on
    `n_devices`."""
    try:
        mesh = run.mesh.shape(n_devices)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    shape = TrainShape(
        param_dtype=run.model.param_dtype,
        compute_dtype=run.model.compute_dtype,
        mesh=mesh,
        remat=run.train.remat,
        micro_batch=run.train.micro_batch,
        seq_len=run.train.seq_len,
        rollout_batch=run.rollout_batch,
        context_len=run.sampling.max_context,
        reference_copy=run.train.kl_coef > 0,
        decode_weights=run.sampling.decode_weights,
    )
    return run.model.arch, shape


TENSOR_WIDTHS = (1, 2, 4, 8, 16)


def with_tensor_width(run, tensor: int):
    """`run` with `mesh.tensor = tensor` and the fsdp axis filling the devices left (the data
    axis kept)."""
    data = run.mesh.data if run.mesh.data != -1 else 1
    return dataclasses.replace(run, mesh=dataclasses.replace(run.mesh, data=data, fsdp=-1,
                                                             tensor=tensor))


def with_per_step_decode_weights(run):
    """`run` with each decode step gathering the weights (`DecodeWeights.PER_STEP`)."""
    return dataclasses.replace(run, sampling=dataclasses.replace(
        run.sampling, decode_weights=DecodeWeights.PER_STEP))


def tensor_alternatives(run, n_devices: int,
                        hbm_bytes: int) -> list[tuple[int, TrainShape, MemoryPlan]]:
    """The tensor widths other than `run`'s whose analytic plan fits `hbm_bytes` per device on
    `n_devices`, each with its shape and plan, lowest peak first: what to try where a recipe's
    own mesh rule fits no slice (16 GiB v5e chips at 32k tokens)."""
    found = []
    for tensor in TENSOR_WIDTHS:
        if tensor == run.mesh.tensor or tensor > run.model.arch.n_heads:
            continue
        try:
            cfg, shape = plan_from_config(with_tensor_width(run, tensor), n_devices)
        except ConfigError:
            continue
        plan = memory_plan(cfg, shape)
        if plan.peak <= hbm_bytes:
            found.append((tensor, shape, plan))
    return sorted(found, key=lambda item: (item[2].peak, item[0]))


def per_step_alternative(run, n_devices: int, hbm_bytes: int) -> MemoryPlan | None:
    """The analytic plan of `run` with each decode step gathering the weights
    (`DecodeWeights.PER_STEP`) where that fits `hbm_bytes` on `n_devices` and `run` holds them
    resident; else None."""
    if run.sampling.decode_weights.streams:
        return None
    try:
        plan = memory_plan(*plan_from_config(with_per_step_decode_weights(run), n_devices))
    except ConfigError:  # the mesh rule does not divide n_devices
        return None
    return plan if plan.peak <= hbm_bytes else None


def format_alternatives(run, n_devices: int, hbm_gib: float) -> str:
    """Lines naming what else the analytic plan fits on this slice (other tensor widths, the
    per-step decode weights), or ''."""
    hbm = int(hbm_gib * GIB)
    lines = []
    if found := tensor_alternatives(run, n_devices, hbm):
        options = ", ".join(f"--config.mesh.tensor={tensor} (mesh {shape.mesh}): "
                            f"{plan.peak / GIB:.1f} GiB" for tensor, shape, plan in found)
        lines.append(f"other meshes the analytic plan fits (check with --compiled): {options}")
    if plan := per_step_alternative(run, n_devices, hbm):
        lines.append(f"with each decode step gathering the weights, a slower decode (check with "
                     f"--compiled): --config.sampling.decode_weights=per_step: "
                     f"{plan.peak / GIB:.1f} GiB")
    return "\n".join(lines)


def device_memory_bytes() -> int:
    """Memory one local device can use: its allocator limit on TPU/GPU; on CPU the host's RAM
    shared by its local (possibly fake) devices."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(ram // jax.local_device_count())


def check_rollout_fits(run, n_devices: int, bytes_per_device: int) -> None:
    """Refuse, at start-up, a cycle whose Agent plays cannot all be held by the sampler.

    Every play of a cycle (K without and K with hint, for each generated and replayed
    environment) decodes in one batch on one KV cache; the plan's sampling peak for that batch,
    next to the resident weights, their copies and the optimizer state, must fit in
    `bytes_per_device`, or the run would die out of memory in its first cycle. When it is KL's
    reference copy that tips it over, the refusal says so.
    """
    cfg, shape = plan_from_config(run, n_devices)
    shape = dataclasses.replace(shape, context_len=run.play_context)
    plan = memory_plan(cfg, shape)
    if plan.sampling_peak <= bytes_per_device:
        return
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    if plan.sampling_peak - plan.reference_weights <= bytes_per_device:
        raise ConfigError(
            f"train.kl_coef={run.train.kl_coef} needs a frozen reference copy of the weights, "
            f"{gib(plan.reference_weights)} per device in {shape.compute_dtype}, and there is "
            f"no room for it: with it a device holds {gib(plan.sampling_peak)} while sampling "
            f"(master weights {gib(plan.parameters)}, optimizer {gib(plan.optimizer)}, sampler "
            f"copy {gib(plan.sampler_weights)}, KV cache {gib(plan.kv_cache)} for "
            f"{shape.rollout_batch} conversations"
            + (f", a copy of half its rows {gib(plan.kv_row_copy)}" if plan.kv_row_copy else "")
            + f", reference {gib(plan.reference_weights)}) "
            f"but has {gib(bytes_per_device)}. Set train.kl_coef=0, use more devices, or "
            "sample fewer conversations at once (spade.plays_per_env, spade.games_per_cycle).")
    s = run.spade
    fits = max_rollout_batch(cfg, shape, bytes_per_device)
    raise ConfigError(
        f"the Agent's plays do not fit in memory: (spade.plays_per_env={s.plays_per_env} + "
        f"spade.hint_plays_per_env={s.hint_plays_per_env}) x "
        f"{s.games_per_cycle + s.replay_per_cycle} environments "
        f"(spade.games_per_cycle={s.games_per_cycle} + spade.replay_per_cycle="
        f"{s.replay_per_cycle}) = {shape.rollout_batch} conversations of up to "
        f"{shape.context_len} tokens need {gib(plan.kv_cache)} of KV cache per device "
        + (f"(and {gib(plan.kv_row_copy)} for a copy of half its rows) " if plan.kv_row_copy
           else "")
        + f"plus {gib(plan.resident)} of parameters, their sampler / KL copies and optimizer "
        "state"
        + (f" and {gib(plan.decode_gathered_weights)} of experts the decode holds gathered "
           "(sampling.decode_weights=per_step gathers them every step)"
           if plan.decode_gathered_weights and not shape.decode_weights.streams else "")
        + f", but a device has {gib(bytes_per_device)}. At most {fits} "
        "conversations fit: lower spade.plays_per_env, spade.hint_plays_per_env, "
        "spade.games_per_cycle or "
        "spade.replay_per_cycle, shorten conversations (spade.max_turns, "
        "sampling.agent_max_new_tokens, sampling.max_context), or use more devices.")


def main(argv) -> None:
    """absl entry point: print the plan for --config on --topology (or --devices/--hbm-gib)."""
    del argv
    from absl import flags

    FLAGS = flags.FLAGS
    if FLAGS.topology:
        n_devices, hbm_gib = topology_devices(FLAGS.topology)
    elif FLAGS.devices and FLAGS.hbm_gib:
        n_devices, hbm_gib = FLAGS.devices, FLAGS.hbm_gib
    else:
        raise ConfigError("pass --topology=v5p-64 (or v4-N / v5e-N / v6e-N), or --devices=N "
                          "--hbm-gib=G")
    from spade_jax.config import parse

    compile_for = FLAGS.compile_for or ("tpu" if FLAGS.topology and importlib.util.find_spec(
        "libtpu") else "cpu")
    if compile_for == "tpu" and not FLAGS.topology:
        raise ConfigError("--compile_for=tpu needs --topology (the slice to compile for)")
    if FLAGS.compiled_layers and not FLAGS.compiled:
        raise ConfigError("--compiled_layers needs --compiled")
    if FLAGS.compiled and compile_for == "cpu":
        from spade_jax.readiness import ensure_devices

        ensure_devices(n_devices, "spade_jax.plan")
    run = parse(FLAGS.config)
    cfg, shape = plan_from_config(run, n_devices)
    plan = memory_plan(cfg, shape)
    print(format_plan(cfg, shape, plan, hbm_gib))
    fits = plan.peak <= hbm_gib * GIB
    if FLAGS.compiled:
        from spade_jax.compiled_plan import compiled_plan, format_compiled_plan

        devices = tpu_topology_devices(FLAGS.topology) if compile_for == "tpu" else None
        compiled = compiled_plan(run, n_devices, devices, layers=FLAGS.compiled_layers)
        print(format_compiled_plan(compiled, hbm_gib))
        fits = compiled.fits(hbm_gib * GIB)
    if not fits and (alternatives := format_alternatives(run, n_devices, hbm_gib)):
        print(alternatives)


def _define_flags() -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "run config file, e.g. configs/30b.py")
    flags.DEFINE_string("topology", None, "TPU slice: v4-N, v5p-N (N cores), v5e-N or v6e-N")
    flags.DEFINE_integer("devices", None, "number of devices (instead of --topology)")
    flags.DEFINE_float("hbm_gib", None, "HBM per device in GiB (with --devices)")
    flags.DEFINE_bool("compiled", False, "also compile the train step and sampler programs at "
                      "the config's depth and report XLA's per-device memory analysis (minutes "
                      "for a 30B config)")
    flags.DEFINE_integer("compiled_layers", None, "with --compiled: compile at this many layers "
                         "and one more and extrapolate per layer instead (quicker; overstates "
                         "programs whose temporaries stop growing with depth)", lower_bound=2)
    flags.DEFINE_enum("compile_for", None, ["tpu", "cpu"], "--compiled's compiler: tpu (ahead "
                      "of time for --topology; needs libtpu, no TPU) or cpu (fake CPU devices); "
                      "default tpu when libtpu is installed")
    flags.mark_flag_as_required("config")


if __name__ == "__main__":
    import sys

    _define_flags()
    sys.argv = [a.replace("--hbm-gib", "--hbm_gib", 1) for a in sys.argv]  # both spellings
    run(main)
