"""The sampler programs' preparation: layers sharing one traced block vs traced one by one.

    python bench/prepare.py [--conversations 16] [--new-tokens 128] [--rounds 4]

`models.transformer.unrolled_forward` calls one jitted decoder block for all its layers, so a
program traces and lowers one layer, not each of them (SmolLM2: 30). This script serves the
mixed rollout of `bench/rollout.py` (SmolLM2-135M-Instruct, greedy, the engine with drafts, a
slot per conversation) with two samplers: one as the code is, one with the layers traced one by
one (the block called unjitted, as before the change). Each first serves it cold, every
program met compiled then (trace, lowering and XLA compilation seconds printed), then both
serve it again `--rounds` times, interleaved, each round starting with the other: the warm
runs time the programs themselves. The two must serve token-identical conversations.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import time

from rollout import Workload, run_engine  # bench/: this script's folder is on sys.path
from sampler import cpu_model

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

PREPARATION_EVENTS = {  # jax.monitoring events of a program's preparation
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "XLA compile",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4, help="warm runs of each way")
    args = parser.parse_args()

    import jax

    import spade_jax
    import spade_jax.models.transformer as transformer
    from spade_jax.sampling import Sampler
    from spade_jax.sampling.sampler import DRAFT_TOKENS
    from spade_jax.spade.rollout import ChatFormat

    events: dict[str, list[float]] = collections.defaultdict(list)
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: events[PREPARATION_EVENTS[event]].append(secs)
        if event in PREPARATION_EVENTS else None)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    policy = spade_jax.load_policy("smollm2-135m-instruct")
    chat = ChatFormat(policy.tokenizer)
    work = Workload(args.conversations, 3, chat, policy.tokenizer)
    capacity = max(len(p) for p in work.prompts) + 3 * (args.new_tokens + 512)
    sampling = dict(temperature=0.0, top_p=1.0, seed=0)
    # how a program met while serving traces the decoder block
    blocks = {"shared block": contextlib.nullcontext,
              "per-layer traces": transformer.tracing_each_layer}

    def serve(sampler, way):
        with blocks[way]():
            return run_engine(sampler, Workload(args.conversations, 3, chat, policy.tokenizer),
                              args.conversations, args.new_tokens, capacity, DRAFT_TOKENS,
                              sampling)[0]

    samplers, outputs = {}, {}
    for way in blocks:
        samplers[way] = Sampler(policy.model)
        events.clear()
        start = time.perf_counter()
        outputs[way] = serve(samplers[way], way)
        seconds = time.perf_counter() - start
        parts = ", ".join(f"{name} {sum(s):.1f} s" for name, s in events.items())
        print(f"{way}, cold: {seconds:.1f} s; {len(events['XLA compile'])} programs: {parts}",
              flush=True)
    warm: dict[str, list[float]] = {way: [] for way in blocks}
    for round_ in range(args.rounds):
        for way in (list(blocks) if round_ % 2 == 0 else list(blocks)[::-1]):
            start = time.perf_counter()
            serve(samplers[way], way)
            warm[way].append(time.perf_counter() - start)
    for way, times in warm.items():
        print(f"{way}, warm: median {statistics.median(times):.1f} s "
              f"({', '.join(f'{t:.1f}' for t in times)})")
    same = outputs["shared block"] == outputs["per-layer traces"]
    print(f"conversations token-identical: {same}")


if __name__ == "__main__":
    main()
