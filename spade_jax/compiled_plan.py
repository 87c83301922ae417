"""The compiled memory plan: XLA's per-device memory analysis of the train step and sampler
programs, compiled at a config's true widths (ahead of time by the TPU compiler for a slice's
topology, or on fake CPU devices), beside the resident state. `spade_jax.plan` is the analytic
model of the same memory and prints this with `--compiled`; `bench/plan_tables.py --compiled`
builds the README's compiled tables from it.
"""

from __future__ import annotations

import dataclasses

import jax

from spade_jax.models.config import ModelConfig
from spade_jax.plan import GIB, TrainShape, rollout_step
from spade_jax.sharding import ResidentBytes

SAMPLER_PROGRAMS = ("sampler.extend", "sampler.decode", "sampler.decode_drafts")
MIN_COMPILED_LAYERS = 2  # XLA compiles a one-step layer loop as straight-line code, whose
# buffers are not on the line through deeper programs


@dataclasses.dataclass(frozen=True)
class CompiledPlan:
    """Per-device bytes from XLA's memory analysis of the compiled programs (the code itself,
    not a model of it): each program's peak (arguments + outputs - donated + temporaries) at
    the config's true widths, plus what stays resident beside it (exact, from the full-depth
    abstract state's shardings). Compiled at the config's depth the peaks are exact; compiled
    at `compiled_layers` and one more layer they are extrapolated linearly, which overstates a
    program whose temporaries stop growing after a few layers (the TPU extend's per-layer
    cache copies do)."""

    layers: int
    compiled_layers: int  # the depth the programs were compiled at (== layers: exact)
    platform: str  # the compiler's: "tpu" (ahead of time for the topology) or "cpu" (fake CPUs)
    # program -> (peak at compiled_layers, bytes per further layer; None when compiled at the
    # config's depth)
    program_peaks: dict[str, tuple[int, int | None]]
    parameters: int  # master weights at full depth
    optimizer: int  # AdamW state at full depth
    sampler_weights: int  # the sampler's compute-dtype copy (0: it shares the masters)
    reference_weights: int  # KL's frozen copy (an argument of the train step, not the sampler)
    # program -> the TPU compiler's message where it refused the program for not fitting the
    # chip's HBM; its peak above is then only the temporaries the message names
    refused: dict[str, str] = dataclasses.field(default_factory=dict)

    def fits(self, hbm_bytes: float) -> bool:
        return not self.refused and self.peak <= hbm_bytes

    def program_peak(self, name: str, layers: int | None = None) -> int:
        """`name`'s peak at `layers` (default: the config's depth): the compiled figure, plus
        one layer's slope per layer beyond it where the plan extrapolates."""
        peak, per_layer = self.program_peaks[name]
        layers = layers or self.layers
        if layers == self.compiled_layers:
            return peak
        if per_layer is None:
            raise ValueError(f"{name} was compiled at {self.compiled_layers} layers only; "
                             f"compile at fewer to extrapolate to {layers}")
        return peak + (layers - self.compiled_layers) * per_layer

    @property
    def resident(self) -> ResidentBytes:
        return ResidentBytes(self.parameters, self.optimizer, self.sampler_weights,
                             self.reference_weights)

    @property
    def sampling_peak(self) -> int:
        """The larger sampler program (its weights and KV cache are its arguments) beside what
        stays resident (`ResidentBytes.beside_sampler`)."""
        program = max(self.program_peak(name) for name in SAMPLER_PROGRAMS
                      if name in self.program_peaks)
        return program + self.resident.beside_sampler

    @property
    def training_peak(self) -> int:
        """The train step (weights, optimizer state, KL copy and batch are its arguments)
        beside the sampler's weight copy (`ResidentBytes.beside_train_step`)."""
        return self.program_peak("train_step") + self.resident.beside_train_step

    @property
    def peak(self) -> int:
        return max(self.sampling_peak, self.training_peak)


def compiled_plan(run, n_devices: int, devices=None, layers: int | None = None) -> CompiledPlan:
    """The `CompiledPlan` of a RunConfig on `n_devices` (of `devices`: None for the visible
    ones, e.g. fake CPUs, or a TPU topology's from `tpu_topology_devices`): compiles the train
    step (one micro-batch of train.seq_len tokens: `spade.batch.train_groups`' largest call)
    and the sampler's extend (its widest chunk, `Sampler.extend_width`) and decode (the
    rollout batch over sampling.max_context slots) with `spade_jax.readiness.check`, at the
    config's depth, or at `layers` and one more layer to extrapolate from."""
    from spade_jax.readiness import check

    depth = run.model.arch.n_layers
    if layers is not None and layers < MIN_COMPILED_LAYERS:
        raise ValueError(f"compiled layers {layers}: compile at least {MIN_COMPILED_LAYERS} "
                         "(a one-layer program is straight-line code)")
    depths = [None] if layers is None or layers + 1 >= depth else [layers, layers + 1]
    peaks: dict[str, list[int]] = {}
    refused: dict[str, str] = {}
    for compiled_layers in depths:
        reports, summary = check(run, n_devices, layers=compiled_layers, seq_len=None,
                                 micro_batches=1, devices=devices)
        for report in reports:
            if report.refused:
                refused[report.name] = report.refused
                peaks.setdefault(report.name, []).append(report.refused_temp_bytes)
                continue
            if not report.memory:
                raise RuntimeError(f"this backend gives no memory analysis of {report.name}: "
                                   "run the plan on CPU")
            peaks.setdefault(report.name, []).append(report.memory["peak"])
    program_peaks = {name: (found[0], found[1] - found[0] if len(found) > 1 else None)
                     for name, found in peaks.items()}
    full = summary["full_state"]
    resident = full["resident"]  # what each program was compiled to leave room for
    return CompiledPlan(
        layers=full["layers"], compiled_layers=depths[0] or depth,
        platform=(devices or jax.devices())[0].platform, program_peaks=program_peaks,
        parameters=resident.masters, optimizer=resident.optimizer,
        sampler_weights=resident.sampler_copy, reference_weights=resident.reference,
        refused=refused)


def format_compiled_plan(plan: CompiledPlan, hbm_gib: float) -> str:
    """A report of `plan` and its verdict against `hbm_gib` per device."""
    g = lambda b: f"{b / GIB:9.2f} GiB"  # noqa: E731
    exact = plan.compiled_layers == plan.layers
    depth = (f"its {plan.layers} layers" if exact else f"{plan.compiled_layers} and "
             f"{plan.compiled_layers + 1} layers, extrapolated to {plan.layers}")
    lines = [f"compiled programs ({plan.platform.upper()} compiler's memory analysis at {depth}), "
             "per device:"]
    for name, (peak, per_layer) in plan.program_peaks.items():
        if name in plan.refused:
            lines.append(f"  {name:<16}>= {peak / GIB:.2f} GiB   refused by the compiler: "
                         f"{plan.refused[name]}")
            continue
        slope = "" if exact else (f"   ({peak / GIB:.2f} GiB at {plan.compiled_layers} layers, "
                                  f"{per_layer / GIB:+.3f} GiB per layer)")
        lines.append(f"  {name:<16}{g(plan.program_peak(name))}{slope}")
    lines += [
        f"  parameters      {g(plan.parameters)}   resident (full depth)",
        f"  optimizer       {g(plan.optimizer)}   resident (full depth)",
        f"  sampler weights {g(plan.sampler_weights)}   resident copy (0: shares the masters)",
        f"  KL reference    {g(plan.reference_weights)}",
        f"  sampling peak   {g(plan.sampling_peak)}   sampler program + optimizer + copies",
        f"  training peak   {g(plan.training_peak)}   train step + sampler copy",
    ]
    verdict = "fits" if plan.fits(hbm_gib * GIB) else "does NOT fit"
    note = ("the TPU compiler's buffer assignment" if plan.platform == "tpu" else
            "CPU buffer assignment, which holds float32 copies a TPU does not")
    at_least = ">= " if plan.refused else ""
    lines.append(f"verdict (compiled): {verdict} ({at_least}{plan.peak / GIB:.1f} of {hbm_gib:g} "
                 f"GiB per device; {note})")
    return "\n".join(lines)


def compiled_max_rollout_batch(plan: CompiledPlan, cfg: ModelConfig, shape: TrainShape,
                               hbm_bytes: int) -> int:
    """Largest sampler batch whose sampling peak fits `hbm_bytes`, from `plan` compiled at
    `shape.rollout_batch`: each further multiple of the KV cache's batch shards adds its cache
    bytes (exact, from the shapes), with the programs' other buffers as compiled."""
    step, one = rollout_step(cfg, shape)
    rows = -(-shape.rollout_batch // step) * step
    steps = (hbm_bytes - plan.sampling_peak) // (one.kv_cache + one.kv_row_copy)
    return max(0, rows + steps * step)
