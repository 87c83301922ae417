"""What sampling costs over greedy decoding in our sampler (same run, same prompts).

    python bench/sampling_cost.py [--batches 1,8,32] [--new-tokens 128] [--runs 3]

SmolLM2-135M-Instruct in float32, ~60-token chat prompts, EOS ignored so every row makes
exactly --new-tokens tokens. For each batch: the wall time of one `generate` call with greedy
decoding, and with the Designer's and Agent's default knobs (temperature 0.6, top-k 20,
top-p 0.95), median over --runs after one warm-up (which compiles). The ratio sampled/greedy is
the price of token selection: top-k candidates, nucleus, noise and the per-row keys.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

from sampler import QUESTIONS, cpu_model, decode_bench_args, timed  # noqa: E402 (bench/sampler.py)

SAMPLED = dict(temperature=0.6, top_k=20, top_p=0.95)  # config.py's designer/agent defaults


def main() -> None:
    args = decode_bench_args(__doc__)

    import spade_jax
    from spade_jax.sampling import generate

    policy = spade_jax.load_policy("smollm2-135m-instruct")
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'batch':>5} {'greedy s':>9} {'sampled s':>10} {'sampled/greedy':>15}")
    for batch in args.batches:
        prompts = [chats[i % len(chats)] for i in range(batch)]

        def run(knobs, prompts=prompts):
            generate(policy.model, policy.tokenizer, prompts, max_new_tokens=args.new_tokens,
                     ignore_eos=True, **knobs)

        greedy = timed(lambda: run({}), args.runs)
        sampled = timed(lambda: run(SAMPLED), args.runs)
        print(f"{batch:>5} {greedy:>9.2f} {sampled:>10.2f} {sampled / greedy:>15.3f}")


if __name__ == "__main__":
    main()
