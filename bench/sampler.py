"""Greedy decode throughput: spade_jax sampler vs HF transformers `generate` (same run).

    python bench/sampler.py [--batches 1,8,32] [--new-tokens 128] [--runs 3]
                            [--decode-dots ynnpack,emitter] [--draft-tokens 0,4]

SmolLM2-135M-Instruct in float32 on 2 threads, ~60-token chat prompts, EOS ignored so every row
makes exactly --new-tokens tokens. tokens/s = batch x new tokens / wall time of one generate
call (prefill included), median over --runs after one warm-up (which compiles ours), the runs
of `transformers` and ours interleaved, so a drift in the machine's speed (a shared VM's
neighbours) moves both. --decode-dots times ours once per way of compiling the CPU decode's
dots (`spade_jax.sampling.DecodeDots`; default: ynnpack, what a run uses), each against the same
`transformers` baseline, so the dot paths' A/B on a machine is one command. --draft-tokens
does the same for the prompt-lookup drafts a decode step verifies (`spade_jax.sampling.drafts`;
default: none and the sampler's default). At batch 1 `transformers` also runs with its own
prompt lookup (`generate(prompt_lookup_num_tokens=...)`, the same draft count; it takes one
row only), a second baseline: drafts pay where the text repeats itself, as the continuations
past EOS often do.

Also printed, as context rather than a baseline: the "matmul bound", the tokens/s of the decoder's
projection and unembedding matmuls alone with the same weights and batch (no attention, cache,
norms, sampling or prefill), i.e. what XLA's CPU matrix products allow a decode step here. It is
timed under each of XLA:CPU's two dot paths (`fastest_matmul_path`) and the faster one is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

QUESTIONS = [
    "Explain in a few sentences why the sky looks blue during the day but red at sunset.",
    "What is the capital of France? Answer in one sentence, then name one famous landmark.",
    "Give me three practical tips for keeping a small vegetable garden healthy in summer.",
    "Describe how a bicycle gear system helps a rider climb steep hills more easily.",
]


def cpu_model() -> str:
    """The 'model name' line of /proc/cpuinfo and its widest vector extensions (which machine a
    figure comes from: a VM's model name is often just "Intel(R) Xeon(R) Processor")."""
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    extensions = [label for label, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"),
                                            ("AVX-512 BF16", "avx512_bf16"), ("AMX", "amx_tile"))
                  if flag in flags]
    return f"{name} ({', '.join(extensions)})" if extensions else name


def compile_seconds() -> list[float]:
    """A list that receives the seconds of every XLA compilation from now on (the shapes a
    timed run meets first)."""
    import jax

    seconds: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **_: seconds.append(secs)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    return seconds


def timed(fn, runs: int) -> float:
    """Median seconds of `runs` calls of `fn` after one warm-up (which compiles ours)."""
    return timed_interleaved({"": fn}, runs)[""]


def timed_interleaved(fns: dict, runs: int) -> dict:
    """Median seconds of each of `fns` after one warm-up each, the runs taken in rounds of one
    each, every round starting one variant later, so neither a drift in the machine's speed
    nor a place in the order favours a variant."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times = {name: [] for name in names}
    for round_ in range(runs):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# XLA:CPU runs dots through YNNPACK library fusions by default; an empty fusion list gives its
# own dot emitter instead, which on this VM was up to 12 % faster on the train step's 2-D
# projections and mostly slower on the unembedding, so a bound that claims "what XLA's matmuls
# allow" takes the faster.
def fastest_matmul_path(lowered, args: tuple, runs: int) -> tuple[float, str]:
    """(median seconds, path name) of the faster dot path for a lowered jax program."""
    import jax

    from spade_jax.sampling.sampler import XLA_DOT_EMITTER

    results = []
    for name, options in {"ynnpack": None, "xla": XLA_DOT_EMITTER}.items():
        program = lowered.compile(compiler_options=options) if options else lowered.compile()
        seconds = timed(lambda program=program: jax.block_until_ready(program(*args)), runs)
        results.append((seconds, name))
    return min(results)


def matmul_bound(policy, batch: int, steps: int, runs: int) -> float:
    """Tokens/s of `steps` greedy steps of only the decoder's matmuls (see the module doc)."""
    import jax
    import jax.numpy as jnp

    from spade_jax.sampling import sampler_for

    fused = sampler_for(policy.model).fused_weights  # the sampler's fused CPU weights
    embed = policy.model.embed[...]
    n_q = policy.config.n_heads * policy.config.head_dim

    def decode(tokens):
        def step(_, tokens):
            x = embed[tokens]
            for p in fused["layers"]:
                x = x + p["wo"](p["wqkv"](x)[:, :n_q])
                gate, up = jnp.split(p["w_gate_up"](x), 2, axis=-1)
                x = x + p["w_down"](jax.nn.silu(gate) * up)
            logits = fused["unembedding"](x, jnp.float32)
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.lax.fori_loop(0, steps, step, tokens)

    tokens = jnp.zeros((batch,), jnp.int32)
    seconds, _ = fastest_matmul_path(jax.jit(decode).lower(tokens), (tokens,), runs)
    return batch * steps / seconds


def decode_dots_list(value: str) -> list:
    """argparse type of --decode-dots: comma-separated `DecodeDots` values, as members."""
    from spade_jax.sampling import DecodeDots

    names = value.split(",")
    unknown = [name for name in names if name not in set(DecodeDots)]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(unknown)}; choose from {', '.join(DecodeDots)}")
    return [DecodeDots(name) for name in names]


def decode_bench_args(doc: str, parser: argparse.ArgumentParser | None = None
                      ) -> argparse.Namespace:
    """The decode benchmarks' flags: --batches (comma-separated), --new-tokens, --runs, and
    those `parser` already has."""
    parser = parser or argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from spade_jax.sampling.sampler import DRAFT_TOKENS

    parser.add_argument("--decode-dots", default="ynnpack", type=decode_dots_list,
                        help="comma-separated DecodeDots values: ynnpack, emitter")
    parser.add_argument("--draft-tokens", default=f"0,{DRAFT_TOKENS}",
                        type=lambda v: [int(k) for k in v.split(",")],
                        help="comma-separated draft counts per greedy step (0: none)")
    args = decode_bench_args(__doc__, parser)
    batches = args.batches
    lookup = max(args.draft_tokens)  # the draft count of transformers' prompt lookup

    import torch
    import transformers

    import spade_jax
    from spade_jax.sampling import Sampler, generate
    from spade_jax.weights.gguf import smollm2_gguf_path

    torch.set_num_threads(2)
    path = smollm2_gguf_path()
    policy = spade_jax.load_policy("smollm2-135m-instruct")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf_tok.padding_side = "left"
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    n = args.new_tokens
    samplers = {(dots, k): Sampler(policy.model, decode_dots=dots, draft_tokens=k)
                for dots in args.decode_dots for k in args.draft_tokens}

    first_sampler = next(iter(samplers.values()))  # no second copy of the weights to compile
    ours_text = generate(policy.model, policy.tokenizer, chats[:1], max_new_tokens=48,
                         sampler=first_sampler)[0].text
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f} (other work skews the figures)")
    print(f"{'batch':>5} {'decode dots':>11} {'drafts':>6} {'ours tok/s':>11} {'HF tok/s':>9} "
          f"{'ratio':>6} {'HF lookup tok/s':>15} {'ratio':>6} {'matmul bound tok/s':>19} "
          f"{'ours/bound':>10}")
    for batch in batches:
        prompts = [chats[i % len(chats)] for i in range(batch)]

        texts = [hf_tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        enc = hf_tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)

        def baseline(enc=enc, **lookup_kwargs):
            with torch.no_grad():
                hf.generate(**enc, do_sample=False, min_new_tokens=n, max_new_tokens=n,
                            pad_token_id=hf_tok.pad_token_id or hf_tok.eos_token_id,
                            **lookup_kwargs)

        baselines = {"transformers": baseline}
        if batch == 1 and lookup:
            baselines["lookup"] = partial(baseline, prompt_lookup_num_tokens=lookup)
        bound_tps = matmul_bound(policy, batch, n, args.runs)
        seconds = timed_interleaved(baselines | {
            variant: lambda prompts=prompts, sampler=sampler: generate(
                policy.model, policy.tokenizer, prompts, max_new_tokens=n, ignore_eos=True,
                sampler=sampler) for variant, sampler in samplers.items()}, args.runs)
        hf_tps = batch * n / seconds.pop("transformers")
        lookup_tps = batch * n / seconds.pop("lookup") if "lookup" in seconds else None
        for (dots, k), ours_seconds in seconds.items():
            ours_tps = batch * n / ours_seconds
            against_lookup = (f"{lookup_tps:>15.1f} {ours_tps / lookup_tps:>5.2f}x"
                              if lookup_tps else f"{'-':>15} {'-':>6}")
            print(f"{batch:>5} {dots.value:>11} {k:>6} {ours_tps:>11.1f} {hf_tps:>9.1f} "
                  f"{ours_tps / hf_tps:>5.2f}x {against_lookup} {bound_tps:>19.1f} "
                  f"{ours_tps / bound_tps:>9.0%}", flush=True)
    with torch.no_grad():
        enc = hf_tok([hf_tok.apply_chat_template(chats[0], tokenize=False,
                                                 add_generation_prompt=True)],
                     return_tensors="pt", add_special_tokens=False)
        out = hf.generate(**enc, do_sample=False, max_new_tokens=48)
    hf_text = hf_tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    print("greedy text equal to HF:", ours_text.strip() == hf_text.strip())
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
