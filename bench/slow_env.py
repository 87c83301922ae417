"""A rollout with slow environment steps: steps in the background vs in lockstep.

    python bench/slow_env.py [--episodes 16] [--slow-step-s 2] [--slow-every 4]
                             [--slow-episodes 0] [--max-turns 3] [--new-tokens 128]
                             [--step-wait-s 1] [--repeats 2]

SmolLM2-135M-Instruct (float32) plays --episodes seed-game episodes through `play_episodes`,
each environment in its sandbox worker, greedy, at most --new-tokens per turn. Step t of
episode i first sleeps --slow-step-s seconds when (i + t) % --slow-every == 0 (a slow tool
call or simulator turn, spread over episodes and turns); the other steps answer in
milliseconds. With --slow-episodes K only episodes 0..K-1 are slowed (K=1 with --slow-every 1:
every step of one environment is slow). The same rollout runs two ways, in rounds (--repeats):
- background: `sandbox.step_wait_s` = --step-wait-s (the default 1 s): a step not back by
  then leaves its episode waiting alone while the others decode on;
- lockstep: `sandbox.step_wait_s=inf`: every pause waits for every step it submitted.
Each run is timed end to end (environment starts, prefill, decode, steps) and split into host
time spent on the environments (starts, submitting steps and waiting for them) and the rest,
with its decode steps and the XLA compilations it met. Episodes are compared token for token:
what an episode samples does not depend on when its steps came back, up to a float near-tie
between programs that compute different row counts.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from sampler import (  # bench/sampler.py: this script's folder is on sys.path
    compile_seconds,
    cpu_model,
)

from spade_jax.eval.tasks import env_class_from_code  # the standard library only: no JAX yet


def slowed(code: str, seconds: float, every: int, offset: int) -> str:
    """An environment's code whose step t (from 1) first sleeps `seconds` when
    (offset + t) % every == 0."""
    name = env_class_from_code(code).__name__
    return (f"{code}\n\nimport time as _time\n_step = {name}.step\n\n\n"
            "def _slow_step(self, action):\n"
            "    self._bench_steps = getattr(self, '_bench_steps', 0) + 1\n"
            f"    if ({offset} + self._bench_steps) % {every} == 0:\n"
            f"        _time.sleep({seconds!r})\n"
            f"    return _step(self, action)\n\n\n{name}.step = _slow_step\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--slow-step-s", type=float, default=2.0)
    parser.add_argument("--slow-every", type=int, default=4)
    parser.add_argument("--slow-episodes", type=int, default=0,
                        help="slow only the first K episodes (0: every episode)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--step-wait-s", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()


    import spade_jax
    from spade_jax.envs import EnvPool, SandboxConfig
    from spade_jax.envs.seeds import list_seed_envs
    from spade_jax.metrics import PhaseTimer
    from spade_jax.sampling import Sampler
    from spade_jax.spade.envrunner import SandboxEnvRunner
    from spade_jax.spade.prompts import GAME_AGENT_SYSTEM_PROMPT
    from spade_jax.spade.rollout import ChatFormat, Decoding, EpisodeSpec, play_episodes

    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible; load average "
          f"{os.getloadavg()[0]:.2f} (other work on the machine skews the figures)", flush=True)
    policy = spade_jax.load_policy("smollm2-135m-instruct")
    chat = ChatFormat(policy.tokenizer)
    sampler = Sampler(policy.model)
    games = list_seed_envs(tool_use=False)
    slow = args.slow_episodes or args.episodes
    specs = [EpisodeSpec(f"game{i}", slowed(games[i % len(games)].code, args.slow_step_s,
                                            args.slow_every, i) if i < slow
                         else games[i % len(games)].code, seed=i)
             for i in range(args.episodes)]
    config = SandboxConfig(step_timeout_s=args.slow_step_s + 30)
    decoding = Decoding(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens)
    capacity = 2048 + args.max_turns * (args.new_tokens + 512)

    sessions = []  # every session the runs open, for their decode steps

    class CountingSampler:
        def start(self, prompts, *, capacity):
            sessions.append(sampler.start(prompts, capacity=capacity))
            return sessions[-1]

    def play(episode_specs, step_wait_s, timer=None):
        with EnvPool(config, warm=8, max_turns=args.max_turns) as pool:
            return play_episodes(
                episode_specs, sampler=CountingSampler(),
                envs=SandboxEnvRunner(pool, args.max_turns), chat=chat,
                system_prompt=GAME_AGENT_SYSTEM_PROMPT, max_turns=args.max_turns,
                decoding=decoding, seed=0, capacity=capacity, step_wait_s=step_wait_s,
                timer=timer)

    # compile what both ways reach outside the timings: the same rollout without slow steps,
    # both ways
    fast = [EpisodeSpec(s.env_id, games[i % len(games)].code, s.seed)
            for i, s in enumerate(specs)]
    play(fast, math.inf)
    play(fast, args.step_wait_s)
    compiling = compile_seconds()
    ways = {"background": args.step_wait_s, "lockstep": math.inf}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    played = {}
    for repeat in range(args.repeats):
        for name, step_wait_s in ways.items():
            compiling.clear()
            sessions.clear()
            timer = PhaseTimer()
            start = time.perf_counter()
            played[name] = play(specs, step_wait_s, timer)
            seconds[name].append(time.perf_counter() - start)
            tokens = sum(e.generated_tokens for e in played[name])
            turns = sum(e.turns for e in played[name])
            print(f"run {repeat + 1} {name:>10}: {seconds[name][-1]:6.1f} s "
                  f"({timer.seconds['env']:.1f} s on environments), {tokens} tokens in "
                  f"{turns} turns, "
                  f"{sum(x.decode_steps for x in sessions)} decode steps, {len(compiling)} XLA "
                  f"compilations took {sum(compiling):.1f} s (load average "
                  f"{os.getloadavg()[0]:.2f})", flush=True)
    same = sum(a.tokens.tolist() == b.tokens.tolist()
               for a, b in zip(played["background"], played["lockstep"], strict=True))
    best = {name: min(times) for name, times in seconds.items()}
    print(f"{same}/{len(specs)} episodes token-identical; best of {args.repeats}: background "
          f"{best['background']:.1f} s, lockstep {best['lockstep']:.1f} s: background is "
          f"{best['lockstep'] / best['background']:.2f}x as fast", flush=True)


if __name__ == "__main__":
    main()
