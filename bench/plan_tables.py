"""The smallest TPU slice each recipe fits on, per generation and context, from the memory plan.

    python bench/plan_tables.py [--contexts 8192,16384,32768]
    python bench/plan_tables.py --devices 8,16,32,64 --contexts 8192    # GPU counts
    python bench/plan_tables.py --compiled --contexts 32768 --generations v4,v5e,v5p

For every recipe config (4B, 8B, 30B-A3B, 32B) and context length (train.seq_len =
sampling.max_context), tries power-of-two slices of 4 to 256 chips of v4, v5e, v5p and v6e with
the config's own mesh rule and rollout batch, and prints a Markdown table per context: the
smallest slice whose peak (`spade_jax.plan.memory_plan`, the larger of the sampling and the
training phase) fits in HBM, with that peak per chip and the largest rollout batch (conversations
sampled at once, `spade_jax.plan.max_rollout_batch`) that slice holds. Where the recipe's
mesh fits no slice, the smallest slice that another tensor width fits, or else the recipe's
mesh with each decode step gathering the weights, named in the cell ("v5litepod-256 (tensor
4): ...", "(per-step decode weights)"; `spade_jax.plan.tensor_alternatives`,
`per_step_alternative`); else "none" with the lowest peak seen.
These are the analytic plan's figures, a model of the code's shapes (see its docstring).
`--compiled` instead compiles each recipe's programs at full depth with the TPU compiler for
the slice (`spade_jax.compiled_plan`; needs libtpu, no TPU) and reports XLA's peak per
chip, with the largest rollout batch from the compiled peak plus the KV cache's exact bytes
per further row (`compiled_max_rollout_batch`). Its search starts at the analytic plan's
smallest fitting slice: the analytic plan leaves out the programs' temporaries, so it has
always been below the compiled figure, and a slice it refuses would not fit compiled either.
Each compiled cell takes minutes (progress on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time

from spade_jax.compiled_plan import compiled_max_rollout_batch, compiled_plan
from spade_jax.config import load_config_file, parse
from spade_jax.errors import ConfigError
from spade_jax.plan import (
    GIB,
    TOPOLOGIES,
    max_rollout_batch,
    memory_plan,
    per_step_alternative,
    plan_from_config,
    tensor_alternatives,
    tpu_topology_devices,
    with_per_step_decode_weights,
    with_tensor_width,
)

RECIPES = (("Qwen3-4B", "4b"), ("Qwen3-8B", "8b"), ("Qwen3-30B-A3B", "30b"),
           ("Qwen3-32B", "32b_dense"))
GENERATIONS = ("v4", "v5e", "v5p", "v6e")
CHIPS = (4, 8, 16, 32, 64, 128, 256)


def slice_name(generation: str, chips: int) -> str:
    """The slice's name: v4 and v5p count TensorCores (2 per chip), v5e and v6e chips."""
    _, chips_per_unit = TOPOLOGIES[generation]
    return f"{'v5litepod' if generation == 'v5e' else generation}-{int(chips / chips_per_unit)}"


def slice_run(config: str, context: int):
    """The RunConfig of `config` with training and sampling at `context` tokens."""
    cfg = load_config_file(config)
    cfg.train.seq_len = context
    cfg.sampling.max_context = context
    return parse(cfg)


def slice_plan(run, devices: int):
    """(peak GiB per device, architecture, TrainShape) of `run` (`slice_run`) on `devices`
    devices; None when its mesh rule does not divide them."""
    try:
        arch, shape = plan_from_config(run, devices)
    except ConfigError:
        return None
    return memory_plan(arch, shape).peak / GIB, arch, shape


def peak_gib(run, devices: int) -> float | None:
    """The plan's peak GiB per device of `run` on `devices` devices; None when its mesh rule
    does not divide them."""
    planned = slice_plan(run, devices)
    return None if planned is None else planned[0]


def _cell(name: str, peak: float, largest: int, variant: str | None) -> str:
    """'v5p-16: 69.6 GiB, ≤ 640', with '(tensor 4)' after the slice for a variant of the
    recipe (`alternatives`)."""
    named = "" if variant is None else f" ({variant})"
    return f"{name}{named}: {peak:.1f} GiB, ≤ {largest}"


def alternatives(run, chips: int, hbm: int):
    """(name, run, analytic plan) of what else fits `chips` chips where the recipe does not:
    the other tensor widths, lowest peak first, then the recipe's mesh with each decode step
    gathering the weights."""
    for tensor, _, plan in tensor_alternatives(run, chips, hbm):
        yield f"tensor {tensor}", with_tensor_width(run, tensor), plan
    if plan := per_step_alternative(run, chips, hbm):
        yield "per-step decode weights", with_per_step_decode_weights(run), plan


def smallest_fit(config: str, context: int, generation: str) -> str:
    """'v5p-16: 69.6 GiB, ≤ 640' for the smallest slice that fits and the largest rollout batch
    it holds; where the recipe's mesh fits no slice, the smallest slice that another tensor
    width fits (`spade_jax.plan.tensor_alternatives`); else 'none (≥ X GiB)'."""
    hbm_gib, _ = TOPOLOGIES[generation]
    hbm = int(hbm_gib * GIB)
    run = slice_run(config, context)
    lowest = None
    for chips in CHIPS:
        planned = slice_plan(run, chips)
        if planned is None:
            continue
        peak, arch, shape = planned
        if peak <= hbm_gib:
            largest = max_rollout_batch(arch, shape, hbm)
            return _cell(slice_name(generation, chips), peak, largest, None)
        lowest = peak if lowest is None else min(lowest, peak)
    for chips in CHIPS:
        for variant, other, plan in alternatives(run, chips, hbm):
            largest = max_rollout_batch(*plan_from_config(other, chips), hbm)
            return _cell(slice_name(generation, chips), plan.peak / GIB, largest, variant)
    return "none" if lowest is None else f"none (≥ {lowest:.1f} GiB)"


def _compiled_cell(run, chips: int, generation: str, analytic: float,
                   variant: str | None) -> tuple[str | None, float]:
    """Compile `run` for the slice of `chips` chips: (its cell if it fits, else None; the
    compiled peak GiB), with a progress line on stderr."""
    hbm_gib, _ = TOPOLOGIES[generation]
    name = slice_name(generation, chips)
    start = time.time()
    plan = compiled_plan(run, chips, tpu_topology_devices(name))
    peak = plan.peak / GIB
    refused = f", refused: {', '.join(plan.refused)}" if plan.refused else ""
    named = "" if variant is None else f" ({variant})"
    print(f"  {name}{named}: compiled {peak:.1f} GiB (sampling {plan.sampling_peak / GIB:.1f}, "
          f"training {plan.training_peak / GIB:.1f}; analytic {analytic:.1f}{refused}), "
          f"{time.time() - start:.0f} s", file=sys.stderr, flush=True)
    if not plan.fits(hbm_gib * GIB):
        return None, peak
    arch, shape = plan_from_config(run, chips)
    largest = compiled_max_rollout_batch(plan, arch, shape, int(hbm_gib * GIB))
    return _cell(name, peak, largest, variant), peak


def compiled_fit(config: str, context: int, generation: str) -> str:
    """`smallest_fit` from the compiled plan: from the analytic plan's smallest fitting slice
    up, the first whose programs, compiled at full depth for the slice, fit; where none does
    with the recipe, its `alternatives` the analytic plan fits, in their order."""
    hbm_gib, _ = TOPOLOGIES[generation]
    run = slice_run(config, context)
    print(f"{config} at {context} tokens on {generation}:", file=sys.stderr, flush=True)
    analytic_fits, lowest, compiled = False, None, []
    for chips in CHIPS:
        planned = slice_plan(run, chips)
        if planned is None:
            continue
        analytic = planned[0]
        analytic_fits = analytic_fits or analytic <= hbm_gib
        if not analytic_fits:
            lowest = analytic if lowest is None else min(lowest, analytic)
            continue
        cell, peak = _compiled_cell(run, chips, generation, analytic, None)
        if cell:
            return cell
        compiled.append(peak)
    for chips in CHIPS:
        for variant, other, plan in alternatives(run, chips, int(hbm_gib * GIB)):
            cell, peak = _compiled_cell(other, chips, generation, plan.peak / GIB, variant)
            if cell:
                return cell
            compiled.append(peak)
    if compiled:
        return f"none (≥ {min(compiled):.1f} GiB compiled)"
    return "none" if lowest is None else f"none (≥ {lowest:.1f} GiB, analytic)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,16384,32768")
    parser.add_argument("--devices", default="",
                        help="e.g. 8,16,32,64: peak GiB per device at each count (GPUs) "
                             "instead of the TPU tables")
    parser.add_argument("--compiled", action="store_true",
                        help="compile each cell's programs for the slice (TPU compiler, needs "
                             "libtpu) instead of the analytic plan; minutes per cell")
    parser.add_argument("--generations", default=",".join(GENERATIONS))
    parser.add_argument("--recipes", default=",".join(name for _, name in RECIPES),
                        help="config names, e.g. 4b,30b")
    args = parser.parse_args()
    generations = args.generations.split(",")
    recipes = [(label, name) for label, name in RECIPES if name in args.recipes.split(",")]
    fit = compiled_fit if args.compiled else smallest_fit
    if args.devices:
        counts = [int(n) for n in args.devices.split(",")]
        for context in (int(c) for c in args.contexts.split(",")):
            print(f"\nContext {context} tokens, peak GiB per device:\n")
            print("| model | " + " | ".join(f"{n} devices" for n in counts) + " |")
            print("|---" * (len(counts) + 1) + "|")
            for label, config in recipes:
                run = slice_run(config, context)
                peaks = [peak_gib(run, n) for n in counts]
                cells = " | ".join("—" if p is None else f"{p:.1f}" for p in peaks)
                print(f"| {label} | {cells} |")
        return
    for context in (int(c) for c in args.contexts.split(",")):
        print(f"\nContext {context} tokens:\n")
        heads = " | ".join(f"{g} ({TOPOLOGIES[g][0]} GiB/chip)" for g in generations)
        print(f"| model | {heads} |")
        print("|---" * (len(generations) + 1) + "|")
        for label, config in recipes:
            cells = " | ".join(fit(config, context, g) for g in generations)
            print(f"| {label} (`{config}.py`) | {cells} |", flush=True)


if __name__ == "__main__":
    main()
