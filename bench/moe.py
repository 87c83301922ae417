"""Routed MoE layer vs the dense reference at Qwen3-30B-A3B's expert shapes, on this machine.

    python bench/moe.py [--tokens 64] [--runs 3] [--tensor 8]
    python bench/moe.py --tile-sweep

One layer, float32, single device: D=2048, F=768, E=128, top-8, `--tokens` tokens. Prints the
CPU model and JAX device, then the median forward time (after one warm-up) and the FLOPs from
XLA's cost analysis of the same compiled program for `moe.moe_mlp_dense` (every expert on
every token) and for `moe.moe_mlp` (routed) with each grouped matmul: `tiled` (what
`moe.grouped_matmul` runs on CPU and GPU), XLA's `ragged_dot`, and on a GPU also JAX's Pallas
Triton lowering of `ragged_dot` where this JAX has it. Each routed row gives its time and
FLOP ratio to dense and its largest difference from dense. XLA's cost analysis on GPU leaves
out library calls (cuBLAS), so FLOP ratios are meaningful on CPU only.

`--tensor N` also runs the layer split over N 'tensor' ranks (N fake CPU devices on CPU, the
first N GPUs on a GPU host) both ways `model.moe_sharding` offers: `experts` (E/N whole experts
a rank, dropless buffers sized for the worst case) and `ffn` (every expert's F/N columns a
rank, buffers of exactly the tokens' copies). Each row gives the time of the whole split layer
(on CPU the N fake devices share this machine's cores, so it sums every rank's work), XLA's
FLOPs per rank and their ratio to the one-device routed layer's.

`--tile-sweep` instead times `moe.tiled_grouped_matmul` alone at 30B-A3B's expert shapes
(rows = tokens x 8 copies, random group sizes) with every tile of 8 to 512 rows, and names the
fastest beside the tile `moe.tile_rows` picks: the measurement behind its cost model.
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

from sampler import cpu_model  # bench/sampler.py: this script's folder is on sys.path

D, F, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B
TRITON_FLAG = "jax_ragged_dot_use_gpu_pallas_triton_lowering"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tensor", type=int, default=1,
                        help="also time the layer split over this many 'tensor' ranks")
    parser.add_argument("--tile-sweep", action="store_true",
                        help="time the tiled grouped matmul at each tile size instead")
    args = parser.parse_args()
    if args.tile_sweep:
        tile_sweep(args.runs)
        return
    if args.tensor > 1:  # before JAX starts: the CPU platform's device count
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.tensor}")

    import jax
    import numpy as np

    from spade_jax.models import moe

    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (1, args.tokens, D))
    router = jax.random.normal(keys[1], (D, E)) * 0.02
    gate = jax.random.normal(keys[2], (E, D, F)) * 0.02
    up = jax.random.normal(keys[3], (E, D, F)) * 0.02
    down = jax.random.normal(keys[4], (E, F, D)) * 0.02
    operands = (x, router, gate, up, down)
    print(f"CPU: {cpu_model()}; JAX {jax.__version__} device: {jax.devices()[0].device_kind} "
          f"({jax.device_count()} of {len(jax.devices()[0].client.devices())} visible)")
    print(f"one MoE layer, float32: {args.tokens} tokens, D={D}, F={F}, E={E}, top-{K}")

    def measure(fn, triton=False, operands=operands):
        if triton:
            jax.config.update(TRITON_FLAG, True)
        try:
            compiled = jax.jit(lambda *a: fn(*a, K, True)).lower(*operands).compile()
        finally:
            if triton:
                jax.config.update(TRITON_FLAG, False)
        jax.block_until_ready(compiled(*operands))  # warm-up
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            out = jax.block_until_ready(compiled(*operands))
            times.append(time.perf_counter() - start)
        return float(np.median(times)), compiled.cost_analysis()["flops"], np.asarray(out)

    dense_s, dense_flops, dense_out = measure(moe.moe_mlp_dense)
    print(f"{'dense':<18} {dense_s * 1e3:9.1f} ms  {dense_flops / 1e9:9.2f} GFLOP (XLA)")
    variants = [("routed, tiled", moe.tiled_grouped_matmul, False),
                ("routed, ragged_dot", jax.lax.ragged_dot, False)]
    if jax.default_backend() == "gpu" and hasattr(jax.config, TRITON_FLAG):
        variants.append(("routed, triton", jax.lax.ragged_dot, True))
    routed = lambda *a: moe.moe_mlp(*a)[0]  # noqa: E731  (the output, not the RouterLoad)
    routed_flops = float("nan")  # the tiled variant's, which the split rows compare with
    for name, grouped, triton in variants:
        with mock.patch.object(moe, "grouped_matmul", grouped):
            try:
                seconds, flops, out = measure(routed, triton)
            except Exception as error:  # one variant failing to build still reports the rest
                print(f"{name:<18} failed: {type(error).__name__}: {str(error)[:200]}")
                continue
        err = float(np.abs(out - dense_out).max())
        print(f"{name:<18} {seconds * 1e3:9.1f} ms  {flops / 1e9:9.2f} GFLOP (XLA)  "
              f"vs dense: time {seconds / dense_s:.2f}x, FLOPs {flops / dense_flops:.2f}x, "
              f"max |difference| {err:.1e}")
        if grouped is moe.tiled_grouped_matmul:
            routed_flops = flops
    if args.tensor > 1:
        split_layer(args.tensor, operands, measure, routed_flops, dense_out)


def split_layer(n_ranks, operands, measure, routed_flops, dense_out) -> None:
    """Rows of the layer split over `n_ranks` 'tensor' ranks, by expert and by hidden column."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from spade_jax.models import moe
    from spade_jax.sharding import make_mesh

    if jax.device_count() < n_ranks:
        raise SystemExit(f"--tensor {n_ranks}: only {jax.device_count()} devices are visible")
    mesh = make_mesh((1, 1, n_ranks), jax.devices()[:n_ranks])
    print(f"split over {n_ranks} 'tensor' ranks ({jax.devices()[0].device_kind}; tokens "
          "replicated over them, one psum combines the ranks):")
    for sharding in moe.MoeSharding:
        gate_axes, down_axes = sharding.weight_axes()
        specs = (PartitionSpec(), PartitionSpec(), PartitionSpec(*gate_axes[1:]),
                 PartitionSpec(*gate_axes[1:]), PartitionSpec(*down_axes[1:]))
        placed = [jax.device_put(a, NamedSharding(mesh, spec))
                  for a, spec in zip(operands, specs, strict=True)]
        with jax.set_mesh(mesh):
            seconds, flops, out = measure(
                lambda *a, s=sharding: moe.moe_mlp(*a, sharding=s)[0], operands=placed)
        err = float(np.abs(out - dense_out).max())
        print(f"{'split, ' + sharding.value:<18} {seconds * 1e3:9.1f} ms  {flops / 1e9:9.2f} "
              f"GFLOP per rank (XLA), {flops / routed_flops:.2f}x the one-device routed "
              f"layer's; max |difference| from dense {err:.1e}")


SWEEP_SHAPES = [  # (rows, groups, in, out): tokens x 8 copies over a rank's experts
    (512, 128, D, F), (4096, 128, D, F), (4096, 128, F, D), (4096, 16, D, F),
    (4096, 128, D, F // 8), (32768, 128, D, F // 8), (32768, 16, D, F)]


def tile_sweep(runs: int) -> None:
    """Times of `tiled_grouped_matmul` per tile size at each of `SWEEP_SHAPES`."""
    import jax

    from spade_jax.models import moe

    print(f"CPU: {cpu_model()}; JAX {jax.__version__} device: {jax.devices()[0].device_kind}")
    print("tiled grouped matmul, float32, ms (best of --runs) per tile size; '-' over 6 GB of "
          "gathered weights")
    for rows, groups, d_in, d_out in SWEEP_SHAPES:
        keys = jax.random.split(jax.random.key(0), 3)
        lhs = jax.random.normal(keys[0], (rows, d_in))
        rhs = jax.random.normal(keys[1], (groups, d_in, d_out)) * 0.02
        sizes = jax.numpy.bincount(jax.random.randint(keys[2], (rows,), 0, groups), length=groups)
        times = {}
        for tile in (8 << i for i in range(7)):
            if moe.tile_count(rows, groups, tile) * d_in * d_out * 4 > 6e9:
                continue
            with mock.patch.object(moe, "tile_rows", lambda n, g, t=tile: t):
                compiled = jax.jit(lambda a, b, c: moe.tiled_grouped_matmul(a, b, c)).lower(
                    lhs, rhs, sizes).compile()
            jax.block_until_ready(compiled(lhs, rhs, sizes))  # warm-up
            seconds = []
            for _ in range(runs):
                start = time.perf_counter()
                jax.block_until_ready(compiled(lhs, rhs, sizes))
                seconds.append(time.perf_counter() - start)
            times[tile] = min(seconds)
        fastest, smallest = min(times, key=times.get), min(times)
        picked = moe.tile_rows(rows, groups)
        row = " ".join(f"{t}:{times[t] * 1e3:.0f}" if t in times else f"{t}:-"
                       for t in (8 << i for i in range(7)))
        print(f"rows {rows:>5} groups {groups:>3} {d_in:>4}x{d_out:<4} {row}  fastest {fastest}, "
              f"tile_rows {picked} ({times[picked] / times[fastest]:.2f}x the fastest, "
              f"{times[smallest] / times[picked]:.2f}x faster than {smallest}-row tiles)",
              flush=True)


if __name__ == "__main__":
    main()
