"""A mixed-length rollout on CPU: continuous batching vs the static session vs HF `generate`.

    python bench/rollout.py [--conversations 64] [--slots 0] [--max-turns 3] [--new-tokens 256]
                            [--repeats 1] [--skip-engine] [--skip-transformers]
                            [--draft-tokens N] [--ablation] [--temperature T] [--top-p P]
                            [--compile-cache DIR]

SmolLM2-135M-Instruct (float32, 2 threads), greedy (or sampled at --temperature, --top-p: the
SPADE rollout's own setting), natural EOS, at most --new-tokens per turn.
Half the conversations are single-turn answers to chat questions, half are multi-turn plays of
the (non-tool-use) seed games, each environment run in this process and stepped on the host
between turns, with the Agent's system prompt and chat format of the SPADE rollout. The same
workload runs three ways, each timed end to end (prefill, decode, appends, env steps):
- engine: `spade_jax.sampling.Engine` with a slot per conversation, as `play_episodes` runs
  it (a conversation's next turn starts as soon as its environment answered, while the others
  keep decoding), or with --slots rows, a freed slot refilled at once; its decode steps
  verify --draft-tokens prompt-lookup drafts per row (default: the sampler's,
  `spade_jax.sampling.drafts`);
- static: one `Session` for all conversations, turn by turn, one token a step (what
  `play_episodes` did until 2026-12-05): each turn decodes every playing row until the last
  one stops;
- transformers: `generate` on the same token ids, turn by turn, each turn re-prefilling the
  conversation so far (left-padded batch), stopping at EOS; greedy runs only (it samples with
  a generator of its own, so at --temperature > 0 its conversations, and so its work, differ).
Useful tokens/s = tokens the conversations generated (to their EOS) / wall seconds, including
the compilations of shapes first met during the run (their count and seconds are printed: a
warm-up cannot meet every shape the schedule produces). With --repeats 2 each way runs the
workload again: what a run of many rollouts sees once its programs are compiled. Outputs are
compared token for token: greedy decoding is deterministic, and our ways draw a sampled token
with the key of (seed, conversation, position) whichever step draws it; but a float near-tie
between two implementations may pick the other token, after which a conversation diverges.
--compile-cache keeps JAX's persistent compilation cache in DIR, as `launch/train.py` does in
<workdir>/compile_cache: the first runs of a second invocation with the same DIR are what a
relaunched job pays, its programs loaded rather than compiled.
--ablation adds the engine without drafts and the static session with them, to split the
engine's gain between its schedule and its drafts. Our ways also print their decode steps
(iterations of the decode loop, each a forward of every row the program computes): on a
device where a step costs about the same for any row count, as a memory-bound accelerator
decode does, their decode times are about in the steps' ratio.
"""

from __future__ import annotations

import argparse
import os
import time

from sampler import (  # bench/sampler.py: this script's folder is on sys.path
    compile_seconds,
    cpu_model,
)

from spade_jax.eval.tasks import env_class_from_code  # the standard library only: no JAX yet

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

QUESTIONS = [
    "Explain in a few sentences why the sky looks blue during the day but red at sunset.",
    "What is the capital of France? Answer in one sentence.",
    "Give me three practical tips for keeping a small vegetable garden healthy in summer.",
    "Describe how a bicycle gear system helps a rider climb steep hills more easily.",
    "Write a haiku about autumn leaves.",
    "What is 17 times 23? Give only the number.",
    "List the planets of the solar system in order from the sun.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
]


class Workload:
    """The conversations: prompts, and for the plays an environment per conversation that turns
    each answer into the next observation (ids of a closed assistant turn + a user turn)."""

    def __init__(self, n: int, max_turns: int, chat, tokenizer):
        from spade_jax.envs.seeds import list_seed_envs
        from spade_jax.spade.prompts import GAME_AGENT_SYSTEM_PROMPT

        self.chat, self.tokenizer, self.max_turns = chat, tokenizer, max_turns
        games = list_seed_envs(tool_use=False)
        self.prompts, self.games = [], []
        for i in range(n):
            if i % 2 == 0:
                self.prompts.append(chat.prompt(
                    [{"role": "user", "content": QUESTIONS[i // 2 % len(QUESTIONS)]}]))
                self.games.append(None)
            else:
                game = games[i // 2 % len(games)]
                self.games.append((game.code, i))
                env = env_class_from_code(game.code)(max_turns=max_turns)
                observation, _ = env.reset(seed=i)
                self.prompts.append(chat.prompt(
                    [{"role": "system", "content": GAME_AGENT_SYSTEM_PROMPT},
                     {"role": "user", "content": str(observation)}]))

    def new_envs(self) -> dict:
        envs = {}
        for i, game in enumerate(self.games):
            if game is not None:
                envs[i] = env_class_from_code(game[0])(max_turns=self.max_turns)
                envs[i].reset(seed=game[1])
        return envs

    def next_observation(self, envs: dict, turns_done: dict, i: int, tokens: list[int],
                         stopped: bool) -> list[int] | None:
        """Step conversation i's environment with its answer; the observation ids, or None."""
        if i not in envs:
            return None
        turns_done[i] = turns_done.get(i, 0) + 1
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        observation, _, terminated, truncated, _ = envs[i].step(text)
        if terminated or truncated or turns_done[i] >= self.max_turns:
            return None
        return self.chat.observation_turn(str(observation)[:2048], stopped)


def run_engine(sampler, work: Workload, slots: int, new_tokens: int, capacity: int,
               drafts: int, sampling: dict):
    from spade_jax.sampling import Engine, Request

    envs, turns_done = work.new_envs(), {}
    engine = Engine(sampler, slots=slots, capacity=capacity, draft_tokens=drafts)
    served = engine.run(
        [Request(p, new_tokens) for p in work.prompts],
        on_turns=lambda ended: {i: obs for i, t in ended.items() if (obs := work.next_observation(
            envs, turns_done, i, t.tokens, t.stopped)) is not None},
        stop_token_ids=[work.chat.eos_id], **sampling)
    return [[t.tokens for t in c.turns] for c in served], engine.decode_steps


def run_static(sampler, work: Workload, new_tokens: int, capacity: int, drafts: int,
               sampling: dict):
    envs, turns_done = work.new_envs(), {}
    n = len(work.prompts)
    session = sampler.start(work.prompts, capacity=capacity, draft_tokens=drafts)
    answers: list[list[list[int]]] = [[] for _ in range(n)]
    active = [True] * n
    while any(active):
        outputs = session.decode(new_tokens, stop_token_ids=[work.chat.eos_id], active=active,
                                 **sampling)
        observations = [None] * n
        for i, out in enumerate(outputs):
            if out is None:
                continue
            answers[i].append(out.tokens)
            observations[i] = work.next_observation(envs, turns_done, i, out.tokens,
                                                    out.stopped)
            active[i] = observations[i] is not None
        if any(active):
            session.append(observations)
    return answers, session.decode_steps


def run_transformers(hf, work: Workload, new_tokens: int, eos: int, pad: int):
    import torch

    envs, turns_done = work.new_envs(), {}
    n = len(work.prompts)
    sequences = [list(p) for p in work.prompts]
    answers: list[list[list[int]]] = [[] for _ in range(n)]
    active = list(range(n))
    while active:
        width = max(len(sequences[i]) for i in active)
        ids = torch.full((len(active), width), pad, dtype=torch.long)
        mask = torch.zeros((len(active), width), dtype=torch.long)
        for row, i in enumerate(active):
            ids[row, width - len(sequences[i]):] = torch.tensor(sequences[i])
            mask[row, width - len(sequences[i]):] = 1
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad)
        still = []
        for row, i in enumerate(active):
            tokens = out[row, width:].tolist()
            stopped = eos in tokens
            tokens = tokens[: tokens.index(eos) + 1] if stopped else tokens
            answers[i].append(tokens)
            sequences[i] += tokens
            observation = work.next_observation(envs, turns_done, i, tokens, stopped)
            if observation is not None:
                sequences[i] += observation
                still.append(i)
        active = still
    return answers, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--slots", type=int, default=0,
                        help="engine rows (0: one per conversation, as play_episodes)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of our ways (transformers compiles nothing: it runs once)")
    parser.add_argument("--draft-tokens", type=int, default=None,
                        help="the engine's drafts per decode step (default: the sampler's)")
    parser.add_argument("--ablation", action="store_true",
                        help="also the engine without drafts and the static session with them")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; SPADE's Agent samples at 0.6, top-p 0.95")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--compile-cache", default=None, metavar="DIR",
                        help="JAX's persistent compilation cache in DIR (default: none)")
    args = parser.parse_args()
    slots = args.slots or args.conversations
    sampling = dict(temperature=args.temperature, top_p=args.top_p, seed=0)
    if args.temperature > 0 and not args.skip_transformers:
        print("transformers is not run at --temperature > 0: it samples other conversations")
        args.skip_transformers = True


    import spade_jax
    from spade_jax.sampling import Sampler
    from spade_jax.sampling.sampler import DRAFT_TOKENS
    from spade_jax.spade.rollout import ChatFormat
    from spade_jax.workdir import enable_compilation_cache

    cache = enable_compilation_cache(args.compile_cache) if args.compile_cache else None
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f} (other work on the machine skews the figures)", flush=True)
    policy = spade_jax.load_policy("smollm2-135m-instruct")
    chat = ChatFormat(policy.tokenizer)
    work = Workload(args.conversations, args.max_turns, chat, policy.tokenizer)
    capacity = max(len(p) for p in work.prompts) + args.max_turns * (args.new_tokens + 512)
    drafts = DRAFT_TOKENS if args.draft_tokens is None else args.draft_tokens
    sampler = Sampler(policy.model)  # one sampler: the ways share its compiled programs
    # compile the programs the runs reach outside the timings (a short run of each way)
    warm = Workload(4, 2, chat, policy.tokenizer)
    for k in {0, drafts}:
        run_engine(sampler, warm, min(slots, 4), 16, capacity, k, sampling)
        run_static(sampler, warm, 16, capacity, k, sampling)

    results, seconds = {}, {}
    runs = {"static": lambda: run_static(sampler, work, args.new_tokens, capacity, 0,
                                         sampling)}
    if not args.skip_engine:
        runs["engine"] = lambda: run_engine(sampler, work, slots, args.new_tokens, capacity,
                                            drafts, sampling)
    if args.ablation:
        runs["engine, 0 drafts"] = lambda: run_engine(sampler, work, slots, args.new_tokens,
                                                      capacity, 0, sampling)
        runs[f"static, {drafts} drafts"] = lambda: run_static(sampler, work, args.new_tokens,
                                                             capacity, drafts, sampling)
    if not args.skip_transformers:
        import torch
        import transformers

        from spade_jax.weights.gguf import smollm2_gguf_path

        torch.set_num_threads(2)
        path = smollm2_gguf_path()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        eos = chat.eos_id
        runs["transformers"] = lambda: run_transformers(hf, work, args.new_tokens, eos, eos)
    compiling = compile_seconds()
    for repeat in range(args.repeats):
        for name, run in runs.items():
            if repeat and name == "transformers":
                continue
            compiling.clear()
            hits_before = cache.counts["hits"] if cache else 0
            start = time.perf_counter()
            results[name], steps = run()
            seconds[name] = time.perf_counter() - start
            tokens = sum(len(t) for turns in results[name] for t in turns)
            loaded = (cache.counts["hits"] - hits_before) if cache else 0  # timed as compiles
            print(f"run {repeat + 1} {name:>16}: {tokens:6d} tokens in {seconds[name]:7.1f} s = "
                  f"{tokens / seconds[name]:6.1f} useful tokens/s, of which "
                  f"{len(compiling) - loaded} XLA compilations"
                  + (f" and {loaded} loads from the cache" if cache else "")
                  + f" took {sum(compiling):.1f} s (load average {os.getloadavg()[0]:.2f})"
                  + (f"; {steps} decode steps" if steps else ""), flush=True)
        for name in results:
            same = sum(a == b for a, b in zip(results[name], results["static"], strict=True))
            ratios = ", ".join(f"{ours} is {seconds[name] / seconds[ours]:.2f}x as fast"
                               for ours in ("static", "engine") if ours in seconds)
            print(f"run {repeat + 1} {name:>16}: {same}/{len(work.prompts)} conversations "
                  f"token-identical to the static session's; {ratios}", flush=True)


if __name__ == "__main__":
    main()
