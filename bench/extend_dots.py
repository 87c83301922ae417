"""Extend (prefill / append) speed under XLA:CPU's two dot paths, by tokens per call.

    python bench/extend_dots.py [--shapes 1x16,8x64,32x48,...] [--contexts 0,1024] [--runs 5]

SmolLM2-135M-Instruct in float32 on this machine's threads. Each shape ROWSxWIDTH is the
sampler's own extend program writing WIDTH tokens per row after each row's CONTEXT cached
tokens (a prefill at 0, an observation appended to a conversation later), from two samplers:
one compiling its extends' dots with YNNPACK's library fusions (XLA's default), one with XLA's
own dot emitter (`XLA_DOT_EMITTER`). Prints the tokens/s of each and their ratio, median of
--runs after a warm-up, the two interleaved. `CPU_EXTEND_EMITTER_TOKENS`
(`spade_jax/sampling/sampler.py`) is the tokens per call from which a sampler compiles its
extends with the emitter; the last column says which path each shape gets.
"""

from __future__ import annotations

import argparse
import itertools
import os
from functools import partial

from sampler import cpu_model, timed_interleaved  # bench/sampler.py: this folder is on sys.path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

SHAPES = "1x16,4x32,8x64,16x32,24x32,16x64,32x48,64x32,32x128"


def positive_ints(value: str, separator: str, minimum: int = 1,
                  count: int | None = None) -> tuple[int, ...]:
    """`value` split at `separator` as ints of at least `minimum` (`count` of them, where
    given), or an argparse error."""
    try:
        numbers = tuple(int(n) for n in value.split(separator))
    except ValueError:
        numbers = ()
    if not numbers or min(numbers) < minimum or count not in (None, len(numbers)):
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected {count or 'some'} integers >= {minimum} separated by "
            f"{separator!r}")
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated ROWSxWIDTH",
                        type=lambda v: [positive_ints(s, "x", count=2) for s in v.split(",")])
    parser.add_argument("--contexts", default="0,1024",
                        type=lambda v: positive_ints(v, ",", minimum=0),
                        help="comma-separated tokens already in each row's cache")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    shapes, contexts = args.shapes, args.contexts

    import jax
    import numpy as np

    import spade_jax
    from spade_jax.sampling import Sampler
    from spade_jax.sampling.programs import bucket
    from spade_jax.sampling.sampler import CPU_EXTEND_EMITTER_TOKENS

    policy = spade_jax.load_policy("smollm2-135m-instruct")
    samplers = {"ynnpack": Sampler(policy.model, extend_emitter_tokens=None),
                "emitter": Sampler(policy.model, extend_emitter_tokens=1)}
    sampler = samplers["ynnpack"]  # for the inputs: both samplers place them alike
    vocab = policy.config.vocab_size
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f} (other work skews the figures)")
    print(f"{'rows x width':>12} {'context':>7} {'tokens':>6} {'YNNPACK tok/s':>13} "
          f"{'emitter tok/s':>13} {'emitter/YNNPACK':>15} {'the sampler uses':>16}")
    for (rows, width), context in itertools.product(shapes, contexts):
        window = bucket(context + width)
        rng = np.random.default_rng(0)
        inputs = [sampler.put_batch(a) for a in (
            np.full((rows,), context, np.int32), rng.integers(0, vocab, (rows, width), np.int32),
            np.ones((rows, width), bool),
            np.tile(context + np.arange(width, dtype=np.int32), (rows, 1)))]
        caches = {name: s.new_cache(rows, window)[0] for name, s in samplers.items()}

        def run(name, rows=rows, window=window, width=width, caches=caches, inputs=inputs):
            # the program donates the cache: each call takes the previous call's
            s = samplers[name]
            program = s.program("extend", rows, window, width=width)
            caches[name] = program(s.state, s.fused_weights, caches[name], *inputs)
            jax.block_until_ready(caches[name])

        seconds = timed_interleaved({name: partial(run, name) for name in samplers}, args.runs)
        tokens = rows * width
        used = "emitter" if tokens >= CPU_EXTEND_EMITTER_TOKENS else "ynnpack"
        print(f"{rows:>5} x {width:<4} {context:>7} {tokens:>6} "
              f"{tokens / seconds['ynnpack']:>13.0f} {tokens / seconds['emitter']:>13.0f} "
              f"{seconds['ynnpack'] / seconds['emitter']:>14.2f}x {used:>16}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
