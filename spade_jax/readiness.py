"""Readiness of a large config without its hardware: build, lower and compile it on fake devices.

    python -m spade_jax.readiness --config=configs/30b.py --topology=v5p-64 --layers=2

On a CPU host this re-executes itself with as many fake CPU devices as the slice has chips
(`--xla_force_host_platform_device_count`), then, on the config's real (data, fsdp, tensor)
mesh and with the real parameter shardings:

1. initialises the model and the AdamW TrainState abstractly (`nnx.eval_shape`: nothing is
   allocated, so the full 48-layer 30B state is checked too);
2. lowers (`jax.jit(...).lower`) the train step and the sampler's `extend` and `decode`
   programs, and compiles them for CPU at `--layers` decoder layers (real widths, real expert
   count), which proves the shardings are consistent and the SPMD partitioner accepts them;
3. prints the memory plan (`spade_jax.plan`) and XLA's per-device memory analysis of each
   compiled program. CPU compilation is a check of the program, not of TPU performance: the
   figures are the CPU backend's buffer assignment and only indicate the TPU one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import time

CPU_DEVICES_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass
class ProgramReport:
    """One lowered (and maybe compiled) program and its per-device memory figures."""

    name: str
    lower_s: float
    compile_s: float | None = None
    memory: dict[str, int] | None = None
    flops: float | None = None  # per device, XLA's cost analysis of the compiled program
    refused: str | None = None  # the compiler's words when the program does not fit its HBM

    @property
    def refused_temp_bytes(self) -> int:
        """The temporaries a refused program needs (the TPU compiler's figure; its arguments
        come on top), 0 when the message gives none."""
        match = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\)", self.refused or "")
        if match is None:
            return 0
        return int(float(match.group(1)) * 1024 ** ("KMGT".index(match.group(2)) + 1))

    def line(self) -> str:
        head = f"{self.name:<14} lowered in {self.lower_s:5.1f}s"
        if self.compile_s is None:
            return head + ", not compiled"
        if self.refused:
            return f"{head}, refused by the compiler in {self.compile_s:5.1f}s: {self.refused}"
        head += f", compiled OK in {self.compile_s:5.1f}s"
        if not self.memory:
            return head + " (no memory analysis on this backend)"
        gib = lambda b: f"{b / (1 << 30):.2f} GiB"  # noqa: E731
        m = self.memory
        return (f"{head}\n{'':<14} per device: arguments {gib(m['argument'])}, outputs "
                f"{gib(m['output'])}, temporaries {gib(m['temp'])}, aliased "
                f"{gib(m['alias'])}; peak ~{gib(m['peak'])}")


def memory_figures(compiled) -> dict[str, int] | None:
    """Per-device bytes from `compiled.memory_analysis()`, or None where the backend has none."""
    try:
        analysis = compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):
        return None
    if analysis is None:
        return None
    m = {
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "alias": int(analysis.alias_size_in_bytes),
        "code": int(analysis.generated_code_size_in_bytes),
    }
    # Donated (aliased) outputs reuse their argument buffers.
    m["peak"] = m["argument"] + m["output"] - m["alias"] + m["temp"]
    return m


def active_params_per_layer(cfg) -> int:
    """Parameters one token multiplies by in a decoder layer: attention, router, top-k experts."""
    attention = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    attention += cfg.n_heads * cfg.head_dim * cfg.d_model
    if cfg.is_moe:
        mlp = cfg.n_experts_per_tok * 3 * cfg.d_model * cfg.expert_ffn_dim
        return attention + mlp + cfg.d_model * cfg.n_experts
    return attention + 3 * cfg.d_model * cfg.ffn_dim


def train_flops_reference(cfg, seq_len: int, logit_positions: int) -> float:
    """6 x N_active + causal attention per token, for what XLA's cost analysis counts of a
    train step: one decoder layer (the layer `scan` body is counted once, whatever the depth)
    and the output projection for `logit_positions` of each row's `seq_len` tokens (one chunk
    of the chunked log-probs loop). Causal attention: QK^T and PV over seq_len/2 keys on
    average, 2 x 2 x H x Dh x seq_len/2 forward, 3x with the backward pass."""
    logits = cfg.d_model * cfg.vocab_size * logit_positions / seq_len
    attention = 6 * cfg.n_heads * cfg.head_dim * seq_len
    return 6 * (active_params_per_layer(cfg) + logits) + attention


def train_recompute_flops(cfg, seq_len: int, logit_positions: int, remat: bool) -> float:
    """FLOPs per token the train step recomputes by design, counted like
    `train_flops_reference`: the log-prob chunk's logits again in its backward pass (the chunk
    is a `jax.checkpoint`), and with remat each decoder layer's forward (2 x N_active plus the
    causal attention forward, 2 x H x Dh x seq_len)."""
    logits = 2 * cfg.d_model * cfg.vocab_size * logit_positions / seq_len
    layer = 2 * active_params_per_layer(cfg) + 2 * cfg.n_heads * cfg.head_dim * seq_len
    return logits + (layer if remat else 0.0)


def decode_flops_reference(cfg, context: int) -> float:
    """2 x N_active per generated token over all layers and the output projection, plus the
    attention of one query against `context` cached slots (decode unrolls its layers)."""
    attention = 4 * cfg.n_heads * cfg.head_dim * context
    return cfg.n_layers * (2 * active_params_per_layer(cfg) + attention) + (
        2 * cfg.d_model * cfg.vocab_size)


def expert_buffer_note(cfg, mesh_shape: dict, tokens: int) -> str:
    """How the compiled MoE sizes its expert buffers, which the FLOPs count in full, for a
    micro-batch of `tokens`; and, dropless, whether a rank routes them in several chunks, a
    loop whose body XLA counts once (so its expert FLOPs are under-counted)."""
    from spade_jax.models.moe import MOE_TOKEN_CHUNK, MoeSharding, tokens_split
    from spade_jax.sharding import BATCH_AXES

    tp = mesh_shape.get("tensor", 1)
    split = cfg.moe_sharding.splits(cfg.n_experts, cfg.expert_ffn_dim, tp)
    by_column = split and cfg.moe_sharding is MoeSharding.FFN
    ranks = cfg.moe_sharding.expert_ranks(cfg.n_experts, cfg.expert_ffn_dim, tp)
    worst = min(cfg.n_experts_per_tok, cfg.n_experts // ranks) * ranks / cfg.n_experts_per_tok
    if cfg.moe_capacity_factor is not None:
        return (f"experts at capacity factor {cfg.moe_capacity_factor:g}: each rank's buffer "
                f"holds {cfg.moe_capacity_factor:g}x its balanced share, copies past it are "
                "dropped")
    if by_column:
        note = (f"experts dropless, split by hidden column over {tp} ranks "
                f"(model.moe_sharding=ffn): each rank's buffer holds exactly its tokens' "
                f"copies, {cfg.expert_ffn_dim // tp} columns wide")
    else:
        note = (f"experts dropless: each of the {ranks} expert ranks' buffers has room for the "
                f"worst case, {worst:.0f}x its balanced share (model.moe_capacity_factor sets "
                "a capacity; model.moe_sharding=ffn gives exact buffers)")
    token_ranks = math.prod(mesh_shape.get(axis, 1) for axis in BATCH_AXES)
    per_rank = tokens // token_ranks if tokens_split(tokens, mesh_shape) else tokens
    if per_rank > MOE_TOKEN_CHUNK:
        chunks = -(-per_rank // MOE_TOKEN_CHUNK)
        note += (f"; NOT COUNTED: a rank routes its {per_rank} tokens in {chunks} chunks of "
                 f"{MOE_TOKEN_CHUNK}, a loop XLA counts once, so the FLOPs above hold one "
                 f"chunk's expert FLOPs (lower --seq_len or raise --micro_batches to count all)")
    return note


def _flops(value: float) -> str:
    return f"{value / 1e9:.3f}G" if value >= 1e8 else f"{value / 1e6:.3f}M"


def flops_per_token(report: ProgramReport, n_devices: int, tokens: int) -> float:
    """Global FLOPs per token of a compiled SPMD program: per-device FLOPs x devices / tokens."""
    return report.flops * n_devices / tokens


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def abstract_train_state(model_cfg, optimizer, mesh, param_dtype):
    """(graphdef, TrainState of ShapeDtypeStructs carrying the real shardings on `mesh`)."""
    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp

    from spade_jax.models.transformer import Transformer
    from spade_jax.rl.trainer import TrainState, state_shardings

    model = nnx.eval_shape(
        lambda: Transformer(model_cfg, rngs=nnx.Rngs(0), param_dtype=jnp.dtype(param_dtype)))
    graphdef, params = nnx.split(model)
    shardings = state_shardings(model_cfg, optimizer, mesh)
    abstract = TrainState(params, jax.eval_shape(optimizer.init, params),
                          jax.ShapeDtypeStruct((), jnp.int32))
    state = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                         abstract, shardings)
    return model, state


def train_batch(rows: int, seq_len: int) -> dict:
    """Abstract train batch in the format of `spade.batch.assemble_batch`."""
    import jax
    import jax.numpy as jnp

    shape = (rows, seq_len)
    dtypes = dict(tokens=jnp.int32, mask=jnp.bool_, loss_mask=jnp.bool_,
                  behaviour_logp=jnp.float32, advantages=jnp.float32)
    return {k: jax.ShapeDtypeStruct(shape, d) for k, d in dtypes.items()}


# what `check` compiles: the drafts' decode where the sampler feeds drafts
PROGRAMS = ("train_step", "sampler.extend", "sampler.decode", "sampler.decode_drafts")


def check(run_cfg, n_devices: int, *, layers: int | None, seq_len: int | None,
          micro_batches: int = 2, rollout_batch: int | None = None, context: int | None = None,
          compile_programs: bool = True, programs: tuple[str, ...] | None = None,
          devices=None) -> tuple[list[ProgramReport], dict]:
    """Lower (and compile) the train step and the sampler programs of `run_cfg`.

    `layers` replaces the decoder depth (None: the config's); `programs` keeps only those
    programs (None: all). `devices` (None: the visible ones) may be a TPU topology's
    (`spade_jax.plan.tpu_topology_devices`): the programs are then compiled ahead of time by
    the TPU compiler, with no TPU attached, each for the HBM its chip has beside the arrays
    that stay resident through the other phase (`ResidentBytes`, as the runtime compiles them).
    Returns the program reports and a summary dict (mesh, parameter counts, shapes used).
    """
    import jax

    from spade_jax.rl.trainer import Remat, TrainStep, make_optimizer
    from spade_jax.sampling.programs import bucket_at_most
    from spade_jax.sampling.sampler import Sampler
    from spade_jax.sharding import ResidentBytes, make_mesh

    unknown = sorted(set(programs or ()) - set(PROGRAMS))
    if unknown:
        raise ValueError(f"unknown programs {unknown}: choose from {list(PROGRAMS)}")
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) < n_devices:
        raise RuntimeError(
            f"{n_devices} devices needed but {len(devices)} are visible; on CPU set "
            f"XLA_FLAGS={CPU_DEVICES_FLAG}={n_devices} before JAX starts")
    mesh = make_mesh(run_cfg.mesh.shape(n_devices), devices[:n_devices])
    full_cfg = run_cfg.model.arch
    model_cfg = full_cfg.replace(n_layers=int(layers)) if layers else full_cfg
    t = run_cfg.train
    optimizer = make_optimizer(t)
    # The full-depth state, abstractly: proves every parameter's spec fits the real mesh.
    _, full_state = abstract_train_state(full_cfg, optimizer, mesh, run_cfg.model.param_dtype)
    # what stays beside each program at full depth: each is compiled to fit the chip's rest
    resident = ResidentBytes.of(full_state.params, full_state.opt_state,
                                run_cfg.model.compute_dtype, kl=bool(run_cfg.train.kl_coef))
    full = dict(layers=full_cfg.n_layers,
                n_params=sum(x.size for x in jax.tree.leaves(full_state.params)),
                moment_dtypes=sorted({str(x.dtype) for x in jax.tree.leaves(full_state.opt_state)
                                      if x.ndim}),
                resident=resident)
    del full_state
    model, state = abstract_train_state(model_cfg, optimizer, mesh, run_cfg.model.param_dtype)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = -(-t.micro_batch // dp) * dp * micro_batches
    seq_len = int(seq_len or t.seq_len)
    context = int(context or run_cfg.sampling.max_context)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))

    compute_dtype = run_cfg.model.compute_dtype
    step = TrainStep(model_cfg, optimizer, mesh, t, micro_batches=micro_batches,
                     compute_dtype=compute_dtype, reserved_bytes=resident.beside_train_step)
    sampler = Sampler(model, mesh=mesh, fuse_weights=False, compute_dtype=compute_dtype,
                      reserved_bytes=resident.beside_sampler,
                      **run_cfg.sampling.sampler_options())
    # padded as a Session pads it: to the axes the KV cache's batch is split over (all three
    # where the KV heads are too few for 'tensor'); unpadded, the cache would be replicated
    shards = sampler.batch_multiple
    rollout_batch = -(-(rollout_batch or run_cfg.rollout_batch) // shards) * shards
    reference = (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, compute_dtype,
                                                             sharding=x.sharding), state.params)
                 if t.kl_coef else None)
    # the widest extend a session runs (chunked prefill), within half the window here
    width = min(sampler.extend_width(rollout_batch), bucket_at_most(context // 2))
    lowerers = {
        "train_step": lambda: step.lower(state, train_batch(rows, seq_len), reference=reference),
        "sampler.extend": lambda: sampler.lower("extend", rollout_batch, context, width=width),
        "sampler.decode": lambda: sampler.lower("decode", rollout_batch, context),
    }
    if sampler.draft_tokens:  # its queries: each row's pending token and drafts
        lowerers["sampler.decode_drafts"] = lambda: sampler.lower(
            "decode", rollout_batch, context, draft_tokens=sampler.draft_tokens)
    if programs is not None:
        lowerers = {name: lowerers[name] for name in programs}
    reports = []
    for name, lower in lowerers.items():
        lowered, lower_s = _timed(lower)
        report = ProgramReport(name, lower_s)
        if compile_programs:
            start = time.perf_counter()
            try:
                compiled = lowered.compile()
            except jax.errors.JaxRuntimeError as err:  # the TPU compiler checks its HBM
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                report.refused = str(err).strip()
            report.compile_s = time.perf_counter() - start
            if not report.refused:
                report.memory = memory_figures(compiled)
                report.flops = float(compiled.cost_analysis().get("flops", 0.0)) or None
        reports.append(report)
    summary = dict(mesh=dict(mesh.shape), layers=model_cfg.n_layers, n_params=n_params,
                   train_batch=(rows, seq_len), micro_batches=micro_batches,
                   rollout_batch=rollout_batch, context=context, full_state=full,
                   n_devices=n_devices, model_cfg=model_cfg,
                   logit_positions=min(t.logprob_chunk, seq_len - 1),
                   remat=Remat(t.remat).recompute_layers, draft_tokens=sampler.draft_tokens)
    return reports, summary


def lower_for_platform(run_cfg, n_devices: int, *, platform: str = "tpu", seq_len: int = 2048,
                       micro_batches: int = 2) -> tuple[ProgramReport, str]:
    """Lower the full-depth train step for `platform` on an AbstractMesh of `n_devices`.

    Needs no devices at all (runs in any process): the real shardings of the full model on the
    target slice, checked by JAX's lowering for that platform. Returns the report and the
    StableHLO text.
    """
    from jax.sharding import AbstractMesh

    from spade_jax.rl.trainer import TrainConfig, TrainStep, make_optimizer
    from spade_jax.sharding import MESH_AXES

    mesh = AbstractMesh(run_cfg.mesh.shape(n_devices), MESH_AXES)
    model_cfg = run_cfg.model.arch
    train_config = TrainConfig(remat=run_cfg.train.remat, micro_batch=run_cfg.train.micro_batch)
    optimizer = make_optimizer(train_config)
    _, state = abstract_train_state(model_cfg, optimizer, mesh, run_cfg.model.param_dtype)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = -(-train_config.micro_batch // dp) * dp * micro_batches
    step = TrainStep(model_cfg, optimizer, mesh, train_config, micro_batches=micro_batches,
                     compute_dtype=run_cfg.model.compute_dtype)
    lowered, seconds = _timed(lambda: step.lower(state, train_batch(rows, seq_len),
                                                 lowering_platforms=(platform,)))
    return ProgramReport(f"train_step[{platform}]", seconds), lowered.as_text()


def ensure_devices(n_devices: int, module: str = "spade_jax.readiness") -> None:
    """On CPU, re-run this command (`python -m module ...`) with `n_devices` fake devices when
    fewer are visible."""
    flags = os.environ.get("XLA_FLAGS", "")
    if CPU_DEVICES_FLAG in flags or os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":
        return
    import jax

    if jax.default_backend() != "cpu" or jax.device_count() >= n_devices:
        return
    env = dict(os.environ, XLA_FLAGS=f"{flags} {CPU_DEVICES_FLAG}={n_devices}".strip(),
               JAX_PLATFORMS="cpu")
    sys.stdout.flush()
    sys.exit(subprocess.call([sys.executable, "-m", module, *sys.argv[1:]],
                             env=env))


def main(argv) -> None:
    """absl entry point: see the module docstring."""
    del argv
    from absl import flags
    from ml_collections import config_flags

    from spade_jax.plan import format_plan, memory_plan, plan_from_config, topology_devices

    FLAGS = flags.FLAGS
    n_devices, hbm_gib = topology_devices(FLAGS.topology)
    ensure_devices(n_devices)
    import jax

    from spade_jax.config import parse

    run_cfg = parse(FLAGS.config)
    name = config_flags.get_config_filename(FLAGS["config"])
    print(f"readiness of {name} on {FLAGS.topology} ({n_devices} devices, "
          f"{jax.default_backend()} backend)")
    print("== memory plan (full depth, analytic) ==")
    cfg, shape = plan_from_config(run_cfg, n_devices)
    print(format_plan(cfg, shape, memory_plan(cfg, shape), hbm_gib))
    reduced_plan = None
    if FLAGS.layers:
        reduced = cfg.replace(n_layers=FLAGS.layers)
        plan = memory_plan(reduced, shape)
        # the plan of the compiled train step: same depth and sequence length
        reduced_plan = memory_plan(reduced, dataclasses.replace(
            shape, seq_len=FLAGS.seq_len or shape.seq_len))
        print(f"plan at {FLAGS.layers} layers: parameters+optimizer "
              f"{(plan.parameters + plan.optimizer) / (1 << 30):.2f} GiB per device")
    report, _ = lower_for_platform(run_cfg, n_devices, seq_len=FLAGS.seq_len or 2048)
    print(f"== full depth ({cfg.n_layers} layers) on an AbstractMesh of {n_devices} devices ==")
    print(report.line().replace("not compiled", "for TPU (no TPU needed to lower)"))
    reports, summary = check(run_cfg, n_devices, layers=FLAGS.layers, seq_len=FLAGS.seq_len,
                             micro_batches=FLAGS.micro_batches,
                             rollout_batch=FLAGS.rollout_batch, context=FLAGS.context,
                             compile_programs=FLAGS.compile)
    full = summary["full_state"]
    gib = 1 << 30
    print(f"== abstract TrainState at full depth ({full['layers']} layers, "
          f"{full['n_params'] / 1e9:.2f}B parameters) on mesh {summary['mesh']} ==")
    print(f"per device: parameters {full['resident'].masters / gib:.2f} GiB, optimizer state "
          f"{full['resident'].optimizer / gib:.2f} GiB (Adam moments in "
          f"{', '.join(full['moment_dtypes'])})")
    print(f"== programs at {summary['layers']} layers ({summary['n_params'] / 1e9:.2f}B "
          f"parameters), mesh {summary['mesh']} ==")
    print(f"train batch {summary['train_batch'][0]} x {summary['train_batch'][1]} tokens in "
          f"{summary['micro_batches']} micro-batches; sampler {summary['rollout_batch']} rows x "
          f"{summary['context']} slots")
    for report in reports:
        print(report.line())
    for line in cost_lines(reports, summary, reduced_plan):
        print(line)
    print("readiness: OK")


def cost_lines(reports: list[ProgramReport], summary: dict, plan=None) -> list[str]:
    """The FLOPs-per-token proof and XLA's peak bytes beside the plan, from compiled reports."""
    by_name = {r.name: r for r in reports}
    cfg, n_devices = summary["model_cfg"], summary["n_devices"]
    rows, seq_len = summary["train_batch"]
    out = []
    train, decode = by_name.get("train_step"), by_name.get("sampler.decode")
    if train is not None and train.flops:
        tokens = rows // summary["micro_batches"] * seq_len
        x = flops_per_token(train, n_devices, tokens)
        y = train_flops_reference(cfg, seq_len, summary["logit_positions"])
        out.append(f"train step FLOPs/token: {_flops(x)} (6·N_active + attention: {_flops(y)}, "
                   f"ratio {x / y:.2f})")
        recompute = train_flops_reference(cfg, seq_len, summary["logit_positions"]) + (
            train_recompute_flops(cfg, seq_len, summary["logit_positions"], summary["remat"]))
        out.append(f"  with the recompute the step chooses (log-prob chunk logits"
                   f"{', remat=block layer forward' if summary['remat'] else ''}): "
                   f"{_flops(recompute)}, ratio {x / recompute:.2f}")
        if cfg.is_moe:
            out.append(f"  {expert_buffer_note(cfg, summary['mesh'], tokens)}")
        out.append(f"  counted as XLA counts loops, each body once: one micro-batch, one of the "
                   f"{cfg.n_layers} decoder layers (N_active "
                   f"{active_params_per_layer(cfg) / 1e6:.1f}M), the output projection for "
                   f"{summary['logit_positions']} of {seq_len} positions (one log-prob chunk)")
    if decode is not None and decode.flops:
        x = flops_per_token(decode, n_devices, summary["rollout_batch"])
        y = decode_flops_reference(cfg, summary["context"])
        out.append(f"decode step FLOPs/token: {_flops(x)} (2·N_active + attention over "
                   f"{summary['context']} slots: {_flops(y)}, ratio {x / y:.2f})")
    drafts = by_name.get("sampler.decode_drafts")
    if drafts is not None and drafts.flops:
        fed = 1 + summary["draft_tokens"]
        x = flops_per_token(drafts, n_devices, summary["rollout_batch"] * fed)
        y = decode_flops_reference(cfg, summary["context"])
        out.append(f"  with {summary['draft_tokens']} drafts, per fed token: {_flops(x)} "
                   f"(ratio {x / y:.2f}; a step takes 1 to {fed} tokens a row)")
    if train is not None and train.memory and plan is not None:
        gib = 1 << 30
        out.append(f"train step peak per device: XLA {train.memory['peak'] / gib:.2f} GiB (CPU "
                   f"buffer assignment), plan {plan.training_peak / gib:.2f} GiB at "
                   f"{cfg.n_layers} layers")
    return out


def _define_flags() -> None:
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "run config file, e.g. configs/30b.py")
    flags.DEFINE_string("topology", "v5p-64", "TPU slice: v5e-N, v5p-N (N cores) or v6e-N")
    flags.DEFINE_integer("layers", 2, "decoder layers to compile (0: the config's depth)")
    flags.DEFINE_integer("seq_len", 2048, "train-step sequence length (0: train.seq_len)")
    flags.DEFINE_integer("micro_batches", 2, "gradient-accumulation micro-batches")
    flags.DEFINE_integer("rollout_batch", 0, "sampler rows (0: the config's rollout batch)")
    flags.DEFINE_integer("context", 0, "sampler cache slots (0: sampling.max_context)")
    flags.DEFINE_bool("compile", True, "compile the lowered programs (else lower only)")
    flags.mark_flag_as_required("config")


if __name__ == "__main__":
    from spade_jax.cli import run

    _define_flags()
    run(main)
