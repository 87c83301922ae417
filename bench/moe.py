"""Routed MoE layer vs the dense reference at Qwen3-30B-A3B's expert shapes, on this machine.

    python bench/moe.py [--tokens 64] [--runs 3]

One layer, float32, single device: D=2048, F=768, E=128, top-8, `--tokens` tokens. Prints the
CPU model and JAX device, then the median forward time (after one warm-up) and the FLOPs from
XLA's cost analysis of the same compiled program for `moe.moe_mlp_dense` (every expert on
every token) and for `moe.moe_mlp` (routed) with each grouped matmul: `tiled` (what
`moe.grouped_matmul` runs on CPU and GPU), XLA's `ragged_dot`, and on a GPU also JAX's Pallas
Triton lowering of `ragged_dot` where this JAX has it. Each routed row gives its time and
FLOP ratio to dense and its largest difference from dense. XLA's cost analysis on GPU leaves
out library calls (cuBLAS), so FLOP ratios are meaningful on CPU only.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from sampler import cpu_model  # bench/sampler.py: this script's folder is on sys.path

D, F, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B
TRITON_FLAG = "jax_ragged_dot_use_gpu_pallas_triton_lowering"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

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

    def measure(fn, triton=False):
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


if __name__ == "__main__":
    main()
