"""Routed MoE layer vs the dense reference at Qwen3-30B-A3B's expert shapes, on this machine.

    python bench/moe.py [--tokens 64] [--runs 3]

One layer, float32, single device: D=2048, F=768, E=128, top-8, `--tokens` tokens. Prints the
CPU model, the median forward time of `moe.moe_mlp` (routed; on CPU its grouped matmuls are
`moe.tiled_grouped_matmul`) and `moe.moe_mlp_dense` (every expert on every token) after one
warm-up, their ratio, and the ratio of their FLOPs from XLA's cost analysis of the same
compiled programs. On a GPU the routed layer's grouped matmuls are `jax.lax.ragged_dot`.
"""

from __future__ import annotations

import argparse
import time

from sampler import cpu_model  # bench/sampler.py: this script's folder is on sys.path

D, F, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B


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
    print(f"CPU: {cpu_model()}; JAX device: {jax.devices()[0].device_kind} "
          f"({jax.device_count()} of {len(jax.devices()[0].client.devices())} visible)")
    print(f"one MoE layer, float32: {args.tokens} tokens, D={D}, F={F}, E={E}, top-{K}")
    results = {}
    routed = lambda *a: moe.moe_mlp(*a)[0]  # noqa: E731  (the output, not the RouterLoad)
    for name, fn in (("routed", routed), ("dense", moe.moe_mlp_dense)):
        compiled = jax.jit(lambda *a, fn=fn: fn(*a, K, True)).lower(*operands).compile()
        flops = compiled.cost_analysis()["flops"]
        jax.block_until_ready(compiled(*operands))  # warm-up
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            out = jax.block_until_ready(compiled(*operands))
            times.append(time.perf_counter() - start)
        results[name] = (float(np.median(times)), flops, out)
        print(f"{name:<7} {results[name][0] * 1e3:9.1f} ms  {flops / 1e9:9.2f} GFLOP (XLA)")
    routed, dense = results["routed"], results["dense"]
    err = float(np.abs(np.asarray(routed[2]) - np.asarray(dense[2])).max())
    print(f"routed / dense: time {routed[0] / dense[0]:.2f}x, FLOPs {routed[1] / dense[1]:.2f}x"
          f" (max |difference| {err:.1e})")


if __name__ == "__main__":
    main()
